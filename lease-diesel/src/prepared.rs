//! Statements diesel-async keeps prepared on each connection.
//!
//! diesel marks every `sql_query` as unsafe to cache, so each call would cost a `Parse`
//! round trip before its `Bind`/`Execute`. Our statements are fixed texts with typed binds,
//! safe to prepare once per connection and reuse: [`Prepared`] says so, keyed by the SQL text.

use diesel::QueryResult;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};

/// A query whose SQL text never changes between calls: cache its prepared statement.
#[derive(Debug, Clone)]
pub(crate) struct Prepared<Q>(pub Q);

impl<Q: QueryFragment<Pg>> QueryFragment<Pg> for Prepared<Q> {
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.0.walk_ast(pass)
    }

    fn is_safe_to_cache_prepared(&self, _backend: &Pg) -> QueryResult<bool> {
        Ok(true)
    }
}

impl<Q> QueryId for Prepared<Q> {
    type QueryId = ();
    // No static id: the statement cache keys it by its SQL text and bind types.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q: Query> Query for Prepared<Q> {
    type SqlType = Q::SqlType;
}
