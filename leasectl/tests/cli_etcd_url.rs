//! What an `etcd://` URL gets before any store is reached: without the `etcd` feature, every
//! command that takes a store URL names the feature to rebuild with (exit 2, like other
//! configuration errors); with it, a bad etcd URL or a Postgres-only flag is a usage error.

mod support;

use support::run;

/// An etcd URL that no test connects to.
const URL: &str = "etcd://127.0.0.1:2379,127.0.0.1:2380/apps/orders";

/// Every command that takes a store URL, with valid flags otherwise.
const COMMANDS: &[&[&str]] = &[
    &["migrate"],
    &["worker", "--group", "orders:4"],
    &["status"],
    &["status", "--group", "orders"],
    &["status", "--group", "orders", "--why", "0"],
    &[
        "release",
        "--group",
        "orders",
        "--worker",
        "6f1c1b39-2e3c-4a4e-9d59-0c3f0c1b7a11",
    ],
    &["resize", "--group", "orders", "--from", "4", "--to", "8"],
    &["doctor"],
    &[
        "drain",
        "--group",
        "orders",
        "--worker",
        "6f1c1b39-2e3c-4a4e-9d59-0c3f0c1b7a11",
    ],
    &[
        "quarantine",
        "--group",
        "orders",
        "--bucket",
        "0",
        "--for",
        "1m",
    ],
];

#[cfg(not(feature = "etcd"))]
#[test]
fn without_the_feature_an_etcd_url_names_the_feature_to_build_with() {
    for args in COMMANDS {
        let (code, out, err) = run(args, Some(URL));
        assert_eq!(code, 2, "{args:?} exited {code}: {err}");
        assert_eq!(
            err.trim_end(),
            "leasectl: --database-url: this leasectl was built without etcd support: rebuild \
             with --features etcd (cargo build -p leasectl --features etcd; needs protoc, \
             Debian package protobuf-compiler)",
            "{args:?}"
        );
        assert!(out.is_empty(), "{args:?} printed {out}");
    }
}

#[cfg(feature = "etcd")]
#[test]
fn with_the_feature_a_bad_etcd_url_or_a_postgres_flag_is_a_usage_error() {
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "etcd://h:70000/p",
            &[],
            "bad port in etcd member \"h:70000\"",
        ),
        ("etcd://h:2379/a b", &[], "bad key prefix \"a b\""),
        (
            "etcds://h:2379/p",
            &[],
            "TLS to etcd (etcds://) is not supported",
        ),
        (URL, &["--transaction-pooler"], "are for Postgres"),
        (
            URL,
            &["--direct-url", "postgres://localhost/app"],
            "are for Postgres",
        ),
    ];
    for (url, extra, said) in cases {
        for args in COMMANDS {
            let args: Vec<&str> = args.iter().chain(extra.iter()).copied().collect();
            let (code, out, err) = run(&args, Some(url));
            assert_eq!(code, 2, "{url} {args:?} exited {code}: {err}");
            assert!(err.contains(said), "{url} {args:?}: {err}");
            assert!(out.is_empty(), "{url} {args:?} printed {out}");
        }
    }
}

/// `grant --apply` is for Postgres roles, with or without the feature.
#[test]
fn grant_apply_on_etcd_says_it_is_for_postgres() {
    let (code, out, err) = run(&["grant", "--role", "app", "--apply"], Some(URL));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("grant --apply works on Postgres only, not on etcd"),
        "{err}"
    );
    assert!(out.is_empty(), "{out}");
}
