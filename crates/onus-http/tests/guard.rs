//! The address classifier as a pure function, over both families and many spellings. No packet
//! leaves the machine: nothing here connects.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::net::IpAddr;

use onus_http::guard::{refusal, Guard};

const REFUSED: &[&str] = &[
    // IPv4
    "0.0.0.0",
    "0.1.2.3",
    "10.0.0.1",
    "10.255.255.255",
    "100.64.0.1",
    "100.127.255.254",
    "100.100.100.200",
    "127.0.0.1",
    "127.0.0.2",
    "127.255.255.254",
    "169.254.169.254",
    "169.254.0.1",
    "172.16.0.1",
    "172.31.255.255",
    "192.0.0.1",
    "192.0.0.170",
    "192.0.2.1",
    "192.88.99.1",
    "192.168.0.1",
    "192.168.255.255",
    "198.18.0.1",
    "198.19.255.255",
    "198.51.100.7",
    "203.0.113.9",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
    // IPv6
    "::",
    "::1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::ffff:8.8.8.8",
    "::127.0.0.1",
    "64:ff9b::7f00:1",
    "64:ff9b::808:808",
    "64:ff9b:1::1",
    "100::1",
    "2001::1",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    "2001:db8::1",
    "2001:2::1",
    "2001:10::1",
    "2001:20::1",
    "2002:7f00:1::1",
    "2002:c0a8:101::1",
    "3fff::1",
    "5f00::1",
    "fc00::1",
    "fd00:ec2::254",
    "fe80::1",
    "fec0::1",
    "ff02::1",
    "ff05::1:3",
    "4000::1",
];

const ALLOWED: &[&str] = &[
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
    "11.0.0.1",
    "100.63.255.255",
    "100.128.0.0",
    "172.15.255.255",
    "172.32.0.0",
    "192.169.0.1",
    "198.17.255.255",
    "198.20.0.0",
    "223.255.255.255",
    "2606:4700:4700::1111",
    "2001:4860:4860::8888",
    "2a00:1450:4001::1",
    "2c0f:fb50::1",
];

#[test]
fn the_classifier_refuses_every_non_global_address() {
    assert!(REFUSED.len() + ALLOWED.len() >= 50);
    for a in REFUSED {
        let ip: IpAddr = a.parse().unwrap();
        assert!(refusal(ip).is_some(), "{a} must be refused");
    }
    for a in ALLOWED {
        let ip: IpAddr = a.parse().unwrap();
        assert_eq!(refusal(ip), None, "{a} is globally routable");
    }
    assert!(refusal("169.254.169.254".parse().unwrap())
        .unwrap()
        .contains("metadata"));
}

#[test]
fn every_url_spelling_of_a_refused_address_is_refused() {
    let g = Guard::default();
    for url in [
        "http://127.0.0.1/",
        "http://2130706433/",
        "http://2130706434:8080/",
        "http://0x7f000001/",
        "http://0x7f000002/",
        "http://0177.0.0.1/",
        "http://0177.0.0.02/",
        "http://127.1/",
        "http://0x7f.1/",
        "http://017700000001/",
        "http://0/",
        "http://0.0.0.0:80/",
        "http://[::1]/",
        "http://[0:0:0:0:0:0:0:1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:7f00:1]/",
        "http://[::]/",
        "http://localhost/",
        "http://LOCALHOST./",
        "http://api.localhost:9000/x",
        "http://169.254.169.254/latest/meta-data/",
        "http://2852039166/",
        "http://0251.0376.0251.0376/",
        "http://0xa9fea9fe/",
        "http://[fd00:ec2::254]/",
        "http://10.1.2.3/",
        "http://192.168.1.1/",
        "https://[fe80::1]/",
    ] {
        let u = reqwest::Url::parse(url).unwrap();
        assert!(g.check_url(&u).is_err(), "{url} must be refused");
    }
    for url in [
        "https://example.com/hook",
        "http://8.8.8.8/",
        "http://134744072/",
        "https://[2606:4700:4700::1111]/",
    ] {
        assert!(
            g.check_url(&reqwest::Url::parse(url).unwrap()).is_ok(),
            "{url} is allowed"
        );
    }
}

#[test]
fn the_allow_list_opens_only_the_networks_it_names() {
    let g = Guard::parse(&["127.0.0.1/32", "fd12:3456::/32"]).unwrap();
    assert!(g.check_ip("127.0.0.1".parse().unwrap()).is_ok());
    assert!(
        g.check_ip("::ffff:127.0.0.1".parse().unwrap()).is_ok(),
        "a mapped address is its IPv4 address"
    );
    assert!(g.check_ip("fd12:3456::9".parse().unwrap()).is_ok());
    assert!(g.check_ip("127.0.0.2".parse().unwrap()).is_err());
    assert!(g.check_ip("::1".parse().unwrap()).is_err());
    assert!(
        g.check_url(&reqwest::Url::parse("http://localhost/").unwrap())
            .is_err(),
        "names are not networks"
    );
    let e = Guard::parse(&["127.0.0.1/33"]).unwrap_err().to_string();
    assert!(e.contains("127.0.0.1/33"), "{e}");
    let single = Guard::parse(&["10.0.0.5"]).unwrap();
    assert!(single.check_ip("10.0.0.5".parse().unwrap()).is_ok());
    assert!(single.check_ip("10.0.0.6".parse().unwrap()).is_err());
}
