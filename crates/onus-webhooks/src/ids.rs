//! Typed ids: an endpoint id is never passed where an event id belongs.

use onus::sql::{FromValue, Value};
use serde::{Deserialize, Serialize};

use crate::Error;

macro_rules! id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        pub struct $name(String);

        impl $name {
            /// The prefix of ids Onus makes.
            pub const PREFIX: &'static str = $prefix;

            /// A new random id: the prefix and 24 letters and digits.
            pub fn random() -> Self {
                $name(random($prefix))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl From<&$name> for Value {
            fn from(id: &$name) -> Value {
                Value::Text(id.0.clone())
            }
        }

        impl From<$name> for Value {
            fn from(id: $name) -> Value {
                Value::Text(id.0)
            }
        }

        impl FromValue for $name {
            fn from_value(v: &Value, backend: onus::sql::Backend) -> Result<Self, String> {
                String::from_value(v, backend).map($name)
            }
        }
    };
}

id!(
    /// An endpoint's id: `ep_...`.
    EndpointId,
    "ep_"
);
id!(
    /// An event's id: `msg_...` when Onus makes it, sent as `webhook-id`.
    EventId,
    "msg_"
);
id!(
    /// A delivery attempt's id: `att_...`.
    AttemptId,
    "att_"
);

impl EndpointId {
    /// An endpoint id as given (looked up, never trusted to exist).
    pub fn from_text(s: &str) -> Self {
        EndpointId(s.to_string())
    }
}

impl EventId {
    /// Checks an id a publisher chose: 1 to 100 letters, digits, `_` or `-`.
    pub fn parse(s: &str) -> Result<Self, Error> {
        let ok = !s.is_empty()
            && s.len() <= 100
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if ok {
            Ok(EventId(s.to_string()))
        } else {
            Err(Error::Invalid(
                "an event id is 1 to 100 letters, digits, '_' or '-'".into(),
            ))
        }
    }

    /// An event id as given (looked up, never trusted to exist).
    pub fn from_text(s: &str) -> Self {
        EventId(s.to_string())
    }
}

fn random(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut rng = rand::thread_rng();
    let s: String = (0..24)
        .map(|_| ALPHABET[rand::Rng::gen_range(&mut rng, 0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}{s}")
}
