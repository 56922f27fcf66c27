//! The benchmark program's library: the soak scenario, shared by `onus-bench soak` and the test
//! suite's short run (`crates/onus-server/tests/soak.rs`).

pub mod soak;

/// `POST {base}/api/v1{path}` with a JSON body and the token: the status and the JSON answer
/// (`null` when the answer is not JSON). An error only when no answer came.
pub async fn post_api(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    path: &str,
    body: &serde_json::Value,
) -> Result<(u16, serde_json::Value), String> {
    let r = http
        .post(format!("{base}/api/v1{path}"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    let text = r.text().await.map_err(|e| e.to_string())?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    ))
}
