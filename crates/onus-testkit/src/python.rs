//! Python tools from PyPI for tests (a schema fuzzer, an SMTP server nobody here wrote), each
//! installed once into its own virtual environment under a directory the caller names (the
//! target directory), pinned to one version.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The virtual environment of `requirement` (`"name==version"`) under `dir`, installed on first
/// use; returns its `bin` directory. Needs `python3` with its `venv` module.
pub fn venv(dir: &Path, requirement: &str) -> PathBuf {
    // Tests of one binary (one per backend) ask at once: one installs, the others wait for it.
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    let venv = dir.join(requirement.replace("==", "-"));
    let bin = venv.join("bin");
    let ready = venv.join("installed");
    if ready.is_file() {
        return bin;
    }
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .unwrap_or_else(|e| panic!("cannot run python3: {e}"))
        .success();
    assert!(
        ok,
        "python3 -m venv failed: install Python 3 with its venv module"
    );
    let out = Command::new(bin.join("pip"))
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            requirement,
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run pip: {e}"));
    assert!(
        out.status.success(),
        "cannot install {requirement} from PyPI: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&ready, requirement)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", ready.display()));
    bin
}
