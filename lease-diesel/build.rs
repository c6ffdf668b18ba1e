//! Rebuild this crate when a migration is added, changed or removed: `embed_migrations!`
//! reads `migrations/` at compile time, and a proc macro cannot ask cargo to watch a
//! directory (a new migration directory would otherwise be left out until some other change).

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
