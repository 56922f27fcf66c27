//! A small filesystem for storage-fault tests: a tmpfs of a given size mounted on a temporary
//! directory (needs root, as the rest of the suite does for PostgreSQL), unmounted when dropped.
//! Writing past its size fails with `ENOSPC`, as a full disk does.

use std::path::Path;
use std::process::Command;

/// A mounted tmpfs of a fixed size.
#[derive(Debug)]
pub struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// Mounts a tmpfs of `bytes` on a fresh temporary directory.
    pub fn mount(bytes: u64) -> Result<SmallDisk, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("no temporary directory: {e}"))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "onus-test"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cannot mount a {bytes}-byte tmpfs (the storage-fault tests run as root, as CI does): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(SmallDisk { dir })
    }

    /// Makes it read-only (`true`) or writable again (`false`); fails while a file on it is open
    /// for writing.
    pub fn read_only(&self, ro: bool) -> Result<(), String> {
        let opt = if ro { "remount,ro" } else { "remount,rw" };
        let out = Command::new("mount")
            .args(["-o", opt])
            .arg(self.dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "mount -o {opt} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazy: a file still open (a store not yet dropped) does not keep the mount.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}
