//! The login page: `/login`.

use maud::{html, Markup};

use super::layout;
use crate::panel::Panel;

/// The login form, with an error to show.
pub fn login(panel: &Panel, error: Option<&str>) -> Markup {
    let body = html! {
        form method="post" action=(panel.href("/login")) class="login" {
            @if let Some(e) = error { p class="error" role="alert" { (e) } }
            label for="token" { "API token or panel password" }
            input id="token" name="token" type="password" autocomplete="current-password" required autofocus;
            p class="hint" { "Print the API token with " code { "onus token show" } "." }
            button type="submit" { "Log in" }
        }
    };
    layout(panel, None, "Log in", 0, body)
}
