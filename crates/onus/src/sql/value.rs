//! Values bound to and read from component statements, in each backend's type convention.

use chrono::DateTime;
use serde::de::DeserializeOwned;
use tokio_postgres::types::{IsNull, ToSql, Type};

use super::Backend;
use crate::clock::Timestamp;

/// A parameter or a column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// NULL.
    Null,
    /// A flag (`boolean` on PostgreSQL, 0/1 on SQLite).
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// Text (UTF-8).
    Text(String),
    /// An instant (`timestamptz` on PostgreSQL, Unix microseconds on SQLite).
    Time(Timestamp),
    /// JSON (`jsonb` on PostgreSQL, text on SQLite).
    Json(serde_json::Value),
    /// Bytes that are not text.
    Bytes(Vec<u8>),
    /// A list of integers, texts or times, for `= ANY($n)` on PostgreSQL (an array) and
    /// `IN (SELECT value FROM json_each($n))` on SQLite (a JSON array).
    List(Vec<Value>),
}

impl Value {
    /// A list of `items`.
    pub fn list<T: Into<Value>>(items: impl IntoIterator<Item = T>) -> Value {
        Value::List(items.into_iter().map(Into::into).collect())
    }

    /// A list as SQLite reads it: a JSON array (times as microseconds).
    fn list_json(&self) -> serde_json::Value {
        match self {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => (*b).into(),
            Value::Int(i) => (*i).into(),
            Value::Float(f) => (*f).into(),
            Value::Text(s) => s.as_str().into(),
            Value::Time(t) => t.timestamp_micros().into(),
            Value::Json(j) => j.clone(),
            Value::Bytes(_) => serde_json::Value::Null,
            Value::List(vs) => vs.iter().map(Value::list_json).collect(),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Value::Null => "NULL",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Text(_) => "text",
            Value::Time(_) => "a time",
            Value::Json(_) => "JSON",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "a list",
        }
    }

    /// JSON of any serializable value.
    pub fn json<T: serde::Serialize + ?Sized>(v: &T) -> Result<Value, crate::sql::StoreError> {
        serde_json::to_value(v).map(Value::Json).map_err(|e| {
            crate::sql::StoreError::Query(format!("a value cannot be written as JSON: {e}"), None)
        })
    }
}

macro_rules! from {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::$v(v.into())
            }
        }
    )*};
}

from!(bool => Bool, i64 => Int, i32 => Int, i16 => Int, u32 => Int, u16 => Int, f64 => Float,
      String => Text, &str => Text, Timestamp => Time, serde_json::Value => Json);

impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Value::Text(v.clone())
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map(Into::into).unwrap_or(Value::Null)
    }
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(match self {
            Value::Null => ToSqlOutput::Borrowed(ValueRef::Null),
            Value::Bool(b) => ToSqlOutput::from(i64::from(*b)),
            Value::Int(v) => ToSqlOutput::from(*v),
            Value::Float(v) => ToSqlOutput::from(*v),
            Value::Text(v) => ToSqlOutput::Borrowed(ValueRef::Text(v.as_bytes())),
            Value::Time(t) => ToSqlOutput::from(t.timestamp_micros()),
            Value::Json(j) => ToSqlOutput::from(j.to_string()),
            Value::Bytes(b) => ToSqlOutput::Borrowed(ValueRef::Blob(b)),
            Value::List(_) => ToSqlOutput::from(self.list_json().to_string()),
        })
    }
}

type BoxError = Box<dyn std::error::Error + Sync + Send>;

impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut tokio_postgres::types::private::BytesMut,
    ) -> Result<IsNull, BoxError> {
        let mismatch = || -> BoxError {
            format!("cannot bind {} to a parameter of type {ty}", self.kind()).into()
        };
        match (self, ty) {
            (Value::Null, _) => Ok(IsNull::Yes),
            (Value::Bool(b), &Type::BOOL) => b.to_sql(ty, out),
            (Value::Int(v), &Type::INT8) => v.to_sql(ty, out),
            (Value::Int(v), &Type::INT4) => i32::try_from(*v)?.to_sql(ty, out),
            (Value::Int(v), &Type::INT2) => i16::try_from(*v)?.to_sql(ty, out),
            (Value::Int(v), &Type::FLOAT8) => (*v as f64).to_sql(ty, out),
            (Value::Float(v), &Type::FLOAT8) => v.to_sql(ty, out),
            (Value::Float(v), &Type::FLOAT4) => (*v as f32).to_sql(ty, out),
            (Value::Text(s), _) if <&str as ToSql>::accepts(ty) => s.as_str().to_sql(ty, out),
            (Value::Time(t), &Type::TIMESTAMPTZ) => t.to_sql(ty, out),
            (Value::Json(j), &Type::JSONB | &Type::JSON) => j.to_sql(ty, out),
            (Value::Json(j), _) if <&str as ToSql>::accepts(ty) => {
                j.to_string().as_str().to_sql(ty, out)
            }
            (Value::Bytes(b), &Type::BYTEA) => b.as_slice().to_sql(ty, out),
            (Value::List(vs), &Type::INT8_ARRAY) => vs
                .iter()
                .map(|v| match v {
                    Value::Int(i) => Ok(*i),
                    _ => Err(mismatch()),
                })
                .collect::<Result<Vec<i64>, _>>()?
                .to_sql(ty, out),
            (Value::List(vs), &Type::TIMESTAMPTZ_ARRAY) => vs
                .iter()
                .map(|v| match v {
                    Value::Time(t) => Ok(*t),
                    _ => Err(mismatch()),
                })
                .collect::<Result<Vec<Timestamp>, _>>()?
                .to_sql(ty, out),
            (Value::List(vs), &Type::TEXT_ARRAY) => vs
                .iter()
                .map(|v| match v {
                    Value::Text(s) => Ok(s.as_str()),
                    _ => Err(mismatch()),
                })
                .collect::<Result<Vec<&str>, _>>()?
                .to_sql(ty, out),
            _ => Err(mismatch()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true // checked per value in to_sql, with an error naming both types
    }

    tokio_postgres::types::to_sql_checked!();
}

/// A SQLite column value.
pub(crate) fn from_sqlite(v: rusqlite::types::ValueRef<'_>) -> Value {
    use rusqlite::types::ValueRef;
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(f) => Value::Float(f),
        ValueRef::Text(t) => match std::str::from_utf8(t) {
            Ok(s) => Value::Text(s.to_string()),
            Err(_) => Value::Bytes(t.to_vec()),
        },
        ValueRef::Blob(b) => Value::Bytes(b.to_vec()),
    }
}

/// A PostgreSQL column value; an unsupported column type is an error naming it.
pub(crate) fn from_postgres(row: &tokio_postgres::Row, i: usize) -> Result<Value, String> {
    fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
        row: &'a tokio_postgres::Row,
        i: usize,
    ) -> Result<Option<T>, String> {
        row.try_get(i).map_err(|e| e.to_string())
    }
    let ty = row.columns()[i].type_();
    let v = match *ty {
        Type::BOOL => get(row, i)?.map(Value::Bool),
        Type::INT8 => get(row, i)?.map(Value::Int),
        Type::INT4 => get::<i32>(row, i)?.map(Value::from),
        Type::INT2 => get::<i16>(row, i)?.map(Value::from),
        Type::FLOAT8 => get(row, i)?.map(Value::Float),
        Type::FLOAT4 => get::<f32>(row, i)?.map(|v| Value::Float(v.into())),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => get(row, i)?.map(Value::Text),
        Type::TIMESTAMPTZ => get(row, i)?.map(Value::Time),
        Type::JSON | Type::JSONB => get(row, i)?.map(Value::Json),
        Type::BYTEA => get(row, i)?.map(Value::Bytes),
        _ => return Err(format!("the column type {ty} is not one Onus reads")),
    };
    Ok(v.unwrap_or(Value::Null))
}

/// A Rust type a column decodes into, in the type convention of the backend the value came
/// from (a time as microseconds, a flag as 0/1 or JSON as text only on SQLite). The error says
/// what was found instead.
pub trait FromValue: Sized {
    /// Decodes `v`, read from `backend`.
    fn from_value(v: &Value, backend: Backend) -> Result<Self, String>;

    /// Decodes `v`, moving what it holds instead of copying it where the type allows.
    fn from_owned(v: Value, backend: Backend) -> Result<Self, String> {
        Self::from_value(&v, backend)
    }

    /// Decodes column `i` of a row PostgreSQL's driver received; the common types straight from
    /// the driver's bytes, the others (and every error, for its message) through a [`Value`].
    fn from_postgres_column(row: &tokio_postgres::Row, i: usize) -> Result<Self, String> {
        Self::from_owned(from_postgres(row, i)?, Backend::Postgres)
    }
}

/// `T` read by the driver from column `i`, or (when the column is not `T`'s type, or NULL) the
/// answer of the [`Value`] path, whose errors say what was found.
fn direct<T, D>(row: &tokio_postgres::Row, i: usize) -> Result<T, String>
where
    T: FromValue,
    D: for<'a> tokio_postgres::types::FromSql<'a> + Into<T>,
{
    match row.try_get::<_, D>(i) {
        Ok(v) => Ok(v.into()),
        Err(_) => T::from_owned(from_postgres(row, i)?, Backend::Postgres),
    }
}

/// Whether a column is NULL, without decoding it.
struct Present;

impl<'a> tokio_postgres::types::FromSql<'a> for Present {
    fn from_sql(_: &Type, _: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Present)
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

fn expected<T>(what: &str, v: &Value) -> Result<T, String> {
    Err(match v {
        Value::Null => format!("NULL where {what} is required"),
        v => format!("expected {what}, found {}", v.kind()),
    })
}

impl FromValue for Value {
    fn from_value(v: &Value, _: Backend) -> Result<Self, String> {
        Ok(v.clone())
    }
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(v: &Value, backend: Backend) -> Result<Self, String> {
        match v {
            Value::Null => Ok(None),
            v => T::from_value(v, backend).map(Some),
        }
    }

    fn from_owned(v: Value, backend: Backend) -> Result<Self, String> {
        match v {
            Value::Null => Ok(None),
            v => T::from_owned(v, backend).map(Some),
        }
    }

    fn from_postgres_column(row: &tokio_postgres::Row, i: usize) -> Result<Self, String> {
        match row.try_get::<_, Option<Present>>(i) {
            Ok(None) => Ok(None),
            _ => T::from_postgres_column(row, i).map(Some),
        }
    }
}

impl FromValue for String {
    fn from_value(v: &Value, _: Backend) -> Result<Self, String> {
        match v {
            Value::Text(s) => Ok(s.clone()),
            v => expected("text", v),
        }
    }

    fn from_owned(v: Value, backend: Backend) -> Result<Self, String> {
        match v {
            Value::Text(s) => Ok(s),
            v => Self::from_value(&v, backend),
        }
    }

    fn from_postgres_column(row: &tokio_postgres::Row, i: usize) -> Result<Self, String> {
        direct::<String, String>(row, i)
    }
}

impl FromValue for i64 {
    fn from_value(v: &Value, _: Backend) -> Result<Self, String> {
        match v {
            Value::Int(i) => Ok(*i),
            v => expected("an integer", v),
        }
    }

    fn from_postgres_column(row: &tokio_postgres::Row, i: usize) -> Result<Self, String> {
        match *row.columns()[i].type_() {
            Type::INT4 => direct::<i64, i32>(row, i),
            Type::INT2 => direct::<i64, i16>(row, i),
            _ => direct::<i64, i64>(row, i),
        }
    }
}

macro_rules! int {
    ($($t:ty),*) => {$(
        impl FromValue for $t {
            fn from_value(v: &Value, backend: Backend) -> Result<Self, String> {
                let i = i64::from_value(v, backend)?;
                <$t>::try_from(i).map_err(|_| {
                    format!("{i} is out of range for {}", stringify!($t))
                })
            }

            fn from_postgres_column(row: &tokio_postgres::Row, at: usize) -> Result<Self, String> {
                let i = i64::from_postgres_column(row, at)?;
                <$t>::try_from(i).map_err(|_| {
                    format!("{i} is out of range for {}", stringify!($t))
                })
            }
        }
    )*};
}

int!(i16, i32, u32, u16, u64);

impl FromValue for f64 {
    fn from_value(v: &Value, _: Backend) -> Result<Self, String> {
        match v {
            Value::Float(f) => Ok(*f),
            Value::Int(i) => Ok(*i as f64),
            v => expected("a number", v),
        }
    }
}

impl FromValue for bool {
    fn from_value(v: &Value, backend: Backend) -> Result<Self, String> {
        match v {
            Value::Bool(b) => Ok(*b),
            Value::Int(0) if backend == Backend::Sqlite => Ok(false),
            Value::Int(1) if backend == Backend::Sqlite => Ok(true),
            Value::Int(i) if backend == Backend::Sqlite => {
                Err(format!("expected a flag (0 or 1), found {i}"))
            }
            v => expected("a flag", v),
        }
    }

    fn from_postgres_column(row: &tokio_postgres::Row, i: usize) -> Result<Self, String> {
        direct::<bool, bool>(row, i)
    }
}

impl FromValue for Timestamp {
    fn from_value(v: &Value, backend: Backend) -> Result<Self, String> {
        match v {
            Value::Time(t) => Ok(*t),
            Value::Int(us) if backend == Backend::Sqlite => DateTime::from_timestamp_micros(*us)
                .ok_or_else(|| format!("{us} microseconds is out of range for a time")),
            v => expected("a time", v),
        }
    }

    fn from_postgres_column(row: &tokio_postgres::Row, i: usize) -> Result<Self, String> {
        direct::<Timestamp, Timestamp>(row, i)
    }
}

impl FromValue for serde_json::Value {
    fn from_value(v: &Value, backend: Backend) -> Result<Self, String> {
        match v {
            Value::Json(j) => Ok(j.clone()),
            Value::Text(s) if backend == Backend::Sqlite => {
                serde_json::from_str(s).map_err(|e| format!("not valid JSON: {e}"))
            }
            v => expected("JSON", v),
        }
    }

    fn from_owned(v: Value, backend: Backend) -> Result<Self, String> {
        match v {
            Value::Json(j) => Ok(j),
            v => Self::from_value(&v, backend),
        }
    }

    fn from_postgres_column(row: &tokio_postgres::Row, i: usize) -> Result<Self, String> {
        direct::<serde_json::Value, serde_json::Value>(row, i)
    }
}

/// A JSON column decoded into `T`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Json<T>(pub T);

impl<T: DeserializeOwned> FromValue for Json<T> {
    fn from_value(v: &Value, backend: Backend) -> Result<Self, String> {
        Self::from_owned(v.clone(), backend)
    }

    fn from_owned(v: Value, backend: Backend) -> Result<Self, String> {
        let j = match v {
            // Text read straight into `T`, without a JSON tree between.
            Value::Text(s) if backend == Backend::Sqlite => {
                return serde_json::from_str(&s)
                    .map(Json)
                    .map_err(|e| format!("JSON of the wrong shape: {e}"))
            }
            v => serde_json::Value::from_owned(v, backend)?,
        };
        serde_json::from_value(j)
            .map(Json)
            .map_err(|e| format!("JSON of the wrong shape: {e}"))
    }

    /// Read straight into `T`, without a JSON tree between.
    fn from_postgres_column(row: &tokio_postgres::Row, i: usize) -> Result<Self, String> {
        match row.try_get::<_, tokio_postgres::types::Json<T>>(i) {
            Ok(j) => Ok(Json(j.0)),
            Err(_) => Self::from_owned(from_postgres(row, i)?, Backend::Postgres),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::Row;
    use std::sync::Arc;

    fn row_on(backend: Backend, values: Vec<Value>) -> Row {
        let columns: Arc<[String]> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        Row::new(backend, "onus_things", columns, values)
    }

    fn row(values: Vec<Value>) -> Row {
        row_on(Backend::Sqlite, values)
    }

    #[test]
    fn each_backends_convention_decodes_to_the_same_type() {
        let t: Timestamp = "2026-03-01T00:00:00Z".parse().unwrap_or_default();
        // SQLite: microseconds, 0/1, JSON text; PostgreSQL: native values.
        let micros = vec![
            Value::Int(t.timestamp_micros()),
            Value::Int(1),
            Value::Text("[\"x\"]".into()),
        ];
        let sqlite = row_on(Backend::Sqlite, micros.clone());
        // The SQLite convention read from PostgreSQL is a table left unmigrated: an error.
        let wrong = row_on(Backend::Postgres, micros);
        assert!(wrong.get::<Timestamp>("a").is_err());
        assert!(wrong.get::<bool>("b").is_err());
        assert!(wrong.get::<serde_json::Value>("c").is_err());
        let pg = row_on(
            Backend::Postgres,
            vec![
                Value::Time(t),
                Value::Bool(true),
                Value::Json(serde_json::json!(["x"])),
            ],
        );
        for r in [sqlite, pg] {
            assert_eq!(r.get::<Timestamp>("a").ok(), Some(t));
            assert_eq!(r.get::<bool>("b").ok(), Some(true));
            assert_eq!(
                r.get::<Json<Vec<String>>>("c").ok(),
                Some(Json(vec!["x".to_string()]))
            );
        }
    }

    #[test]
    fn a_bad_value_is_an_error_naming_table_and_column() {
        let r = row(vec![Value::Null, Value::Int(7), Value::Text("{".into())]);
        let msg = |e: Result<(), crate::sql::StoreError>| e.err().map(|e| e.to_string());
        assert_eq!(
            msg(r.get::<String>("a").map(|_| ())).as_deref(),
            Some("cannot read column a of onus_things: NULL where text is required")
        );
        assert_eq!(r.get::<Option<String>>("a").ok(), Some(None));
        assert_eq!(
            msg(r.get::<bool>("b").map(|_| ())).as_deref(),
            Some("cannot read column b of onus_things: expected a flag (0 or 1), found 7")
        );
        assert!(msg(r.get::<serde_json::Value>("c").map(|_| ()))
            .is_some_and(|m| m.contains("column c") && m.contains("not valid JSON")));
        assert_eq!(
            msg(r.get::<i64>("missing").map(|_| ())).as_deref(),
            Some(
                "cannot read column missing of onus_things: the column is missing from the result"
            )
        );
        assert!(msg(r.get::<u16>("b").map(|_| ())).is_none());
        let big = row(vec![Value::Int(70_000), Value::Null, Value::Null]);
        assert!(msg(big.get::<u16>("a").map(|_| ())).is_some_and(|m| m.contains("out of range")));
    }
}
