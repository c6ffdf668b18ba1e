//! Finding the system's `etcd` binary.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The environment variable naming the etcd binary (or a directory holding it) to use.
pub(crate) const BIN_VAR: &str = "LEASE_ETCD_BIN";

/// What to install, for every message about a missing binary.
const INSTALL: &str = "install the Debian/Ubuntu package `etcd-server` (`apt install etcd-server`, \
     which provides /usr/bin/etcd; scripts/test.sh does it when run as root)";

/// The `etcd` binary: `LEASE_ETCD_BIN` (the binary or its directory) if set, else the first
/// `etcd` on `PATH`, else `/usr/bin/etcd`; or a message naming the package to install.
pub(crate) fn etcd() -> Result<PathBuf, String> {
    find_etcd(
        std::env::var_os(BIN_VAR),
        std::env::var_os("PATH"),
        &[Path::new("/usr/bin")],
    )
}

fn find_etcd(
    explicit: Option<OsString>,
    path: Option<OsString>,
    fallback: &[&Path],
) -> Result<PathBuf, String> {
    if let Some(explicit) = explicit.filter(|v| !v.is_empty()) {
        let given = PathBuf::from(explicit);
        let candidate = if given.is_dir() {
            given.join("etcd")
        } else {
            given.clone()
        };
        // Set on purpose: never fall back to another etcd than the one asked for.
        return if is_executable(&candidate) {
            Ok(candidate)
        } else {
            Err(format!(
                "{BIN_VAR} is {}, which is not an etcd binary nor a directory holding one: \
                 point it at one, or unset it and {INSTALL}",
                given.display()
            ))
        };
    }
    path.map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(fallback.iter().map(|d| d.to_path_buf()))
        .map(|d| d.join("etcd"))
        .find(|p| is_executable(p))
        .ok_or_else(|| {
            format!(
                "the etcd tests start their own etcd cluster and need the etcd server binary, \
                 which is not on PATH nor in /usr/bin: {INSTALL}, or set {BIN_VAR} to an etcd \
                 binary (3.4 or newer)"
            )
        })
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("lease-testetcd-bins-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        dir
    }

    #[test]
    fn a_missing_etcd_names_the_debian_package() {
        let empty = temp_dir("empty");
        let err = find_etcd(None, Some(empty.clone().into_os_string()), &[&empty])
            .expect_err("no etcd in an empty directory");
        assert!(err.contains("`etcd-server`"), "{err}");
        assert!(err.contains(BIN_VAR), "{err}");
        std::fs::remove_dir_all(empty).ok();
    }

    #[test]
    fn an_explicit_binary_wins_and_a_wrong_one_is_not_replaced() {
        let dir = temp_dir("explicit");
        let fake = dir.join("etcd");
        std::fs::write(&fake, "#!/bin/sh\n").expect("a fake etcd");
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let elsewhere = temp_dir("elsewhere");
        let elsewhere_etcd = elsewhere.join("etcd");
        std::fs::write(&elsewhere_etcd, "#!/bin/sh\n").expect("another fake etcd");
        std::fs::set_permissions(&elsewhere_etcd, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let path = Some(elsewhere.clone().into_os_string());

        assert_eq!(
            find_etcd(Some(fake.clone().into_os_string()), path.clone(), &[]),
            Ok(fake.clone())
        );
        assert_eq!(
            find_etcd(Some(dir.clone().into_os_string()), path.clone(), &[]),
            Ok(fake.clone())
        );
        assert_eq!(find_etcd(None, path.clone(), &[]), Ok(elsewhere_etcd));
        let err = find_etcd(Some(dir.join("nope").into_os_string()), path, &[])
            .expect_err("a wrong LEASE_ETCD_BIN is an error");
        assert!(
            err.contains(BIN_VAR) && err.contains("`etcd-server`"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).ok();
        std::fs::remove_dir_all(elsewhere).ok();
    }

    #[test]
    fn a_file_that_is_not_executable_is_not_etcd() {
        let dir = temp_dir("noexec");
        std::fs::write(dir.join("etcd"), "").expect("a file");
        assert!(find_etcd(None, Some(dir.clone().into_os_string()), &[]).is_err());
        std::fs::remove_dir_all(dir).ok();
    }
}
