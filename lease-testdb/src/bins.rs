//! Finding the system's server binaries, and the user to run them as.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Command;

fn bin_candidates() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os("LEASE_PG_BINDIR") {
        dirs.push(PathBuf::from(dir));
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        dirs.push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    }
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                Some((v, e.path().join("bin")))
            })
            .collect();
        versions.sort_by_key(|v| std::cmp::Reverse(v.0));
        dirs.extend(versions.into_iter().map(|(_, p)| p));
    }
    dirs
}

/// The directory holding `initdb`, `pg_ctl` and `postgres`, or what to install.
pub(crate) fn postgres_bindir() -> Result<PathBuf, String> {
    bin_candidates()
        .into_iter()
        .find(|d| {
            d.join("initdb").is_file() && d.join("pg_ctl").is_file() && d.join("postgres").is_file()
        })
        // Where `initdb` really is (a directory on PATH may hold links to a few of the
        // binaries only), so `psql` and `pg_basebackup` are found next to it.
        .map(|d| {
            std::fs::canonicalize(d.join("initdb"))
                .ok()
                .and_then(|p| p.parent().map(PathBuf::from))
                .unwrap_or(d)
        })
        .ok_or_else(|| {
            "The Postgres tests need a PostgreSQL server: install the server binaries \
             (Debian/Ubuntu: `apt install postgresql`, which provides initdb and pg_ctl under \
             /usr/lib/postgresql/<version>/bin), or set LEASE_PG_BINDIR to their directory, or \
             set DATABASE_URL to a server where the tests may create databases."
                .to_owned()
        })
}

/// The path of `program` on `PATH` or in the system directories, or a message naming the
/// Debian package that provides it.
pub(crate) fn program(program: &str, package: &str) -> Result<PathBuf, String> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "this test needs `{program}`: install the Debian/Ubuntu package `{package}` \
                 (`apt install {package}`; scripts/test.sh does it when run as root)"
            )
        })
}

/// The uid and gid of `user`, from /etc/passwd.
fn lookup_user(user: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.first() == Some(&user) && fields.len() > 3)
            .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
            .flatten()
    })
}

/// The uid and gid to run servers as: none when the tests do not run as root; the
/// `postgres` (or `nobody`) user when they do, since Postgres refuses to run as root.
pub(crate) fn run_as() -> Result<Option<(u32, u32)>, String> {
    let euid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0);
    if euid != 0 {
        return Ok(None);
    }
    lookup_user("postgres")
        .or_else(|| lookup_user("nobody"))
        .map(Some)
        .ok_or_else(|| {
            "running as root, the test cluster needs a `postgres` or `nobody` user to run as"
                .to_owned()
        })
}
