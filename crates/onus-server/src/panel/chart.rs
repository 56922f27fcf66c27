//! Throughput and failures over time, drawn on the server as SVG (no script, no assets).

use maud::{html, Markup};
use onus::store::HistoryRow;
use onus::{JobState, Timestamp};

/// One bar: jobs completed and attempts failed (retryable or discarded) in its span.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bucket {
    pub completed: u64,
    pub failed: u64,
}

/// Buckets `n` spans of `span` ending at `now` (the last bucket holds `now`), from per-minute
/// history rows.
pub fn buckets(
    history: &[HistoryRow],
    now: Timestamp,
    span: chrono::TimeDelta,
    n: usize,
) -> Vec<Bucket> {
    let span_s = span.num_seconds().max(60);
    let last = now.timestamp().div_euclid(span_s);
    let first = last - n as i64 + 1;
    let mut out = vec![Bucket::default(); n];
    for h in history {
        let i = h.minute.timestamp().div_euclid(span_s) - first;
        if i < 0 || i >= n as i64 {
            continue;
        }
        let b = &mut out[i as usize];
        match h.state {
            JobState::Completed => b.completed += h.count,
            JobState::Retryable | JobState::Discarded => b.failed += h.count,
            _ => {}
        }
    }
    out
}

/// A bar chart of buckets, completed below and failures stacked above, each bar titled with its
/// numbers. `label(i)` names bucket `i` (in the bars' titles); `from` and `to` label the axis.
pub fn bars(
    caption: &str,
    data: &[Bucket],
    label: impl Fn(usize) -> String,
    (from, to): (&str, &str),
) -> Markup {
    const W: f64 = 600.0;
    const H: f64 = 120.0;
    let max = data
        .iter()
        .map(|b| b.completed + b.failed)
        .max()
        .unwrap_or(0)
        .max(1);
    let completed: u64 = data.iter().map(|b| b.completed).sum();
    let failed: u64 = data.iter().map(|b| b.failed).sum();
    let step = W / data.len().max(1) as f64;
    let width = (step * 0.8).max(1.0);
    let y = |n: u64| H * n as f64 / max as f64;
    let summary = format!("{caption}: {completed} completed, {failed} failed attempts");
    html! {
        figure class="chart" {
            figcaption {
                (caption) ": "
                span class="state completed" { (completed) " completed" } ", "
                span class="state discarded" { (failed) " failed attempts" }
                span class="hint" { " (highest bar " (max) ")" }
            }
            svg viewBox=(format!("0 0 {W} {H}")) role="img" aria-label=(summary)
                preserveAspectRatio="none" {
                line x1="0" y1=(H) x2=(W) y2=(H) class="axis" {}
                @for (i, b) in data.iter().enumerate() {
                    @let x = i as f64 * step + (step - width) / 2.0;
                    @let ok = y(b.completed);
                    @let bad = y(b.failed);
                    g {
                        title { (label(i)) ": " (b.completed) " completed, " (b.failed) " failed" }
                        @if b.completed > 0 {
                            rect class="ok" x=(fmt(x)) y=(fmt(H - ok)) width=(fmt(width)) height=(fmt(ok)) {}
                        }
                        @if b.failed > 0 {
                            rect class="bad" x=(fmt(x)) y=(fmt(H - ok - bad)) width=(fmt(width)) height=(fmt(bad)) {}
                        }
                    }
                }
            }
            // Outside the stretched drawing, so the text keeps its shape at any width.
            div class="ticks" aria-hidden="true" {
                span { (from) } span { (to) }
            }
        }
    }
}

fn fmt(v: f64) -> String {
    format!("{v:.1}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(minute: &str, state: JobState, count: u64) -> HistoryRow {
        HistoryRow {
            minute: minute.parse().unwrap(),
            kind: "k".into(),
            state,
            count,
        }
    }

    #[test]
    fn minutes_fall_into_their_buckets_and_old_ones_drop() {
        let now: Timestamp = "2026-12-01T10:30:20Z".parse().unwrap();
        let h = vec![
            row("2026-12-01T10:30:00Z", JobState::Completed, 3),
            row("2026-12-01T10:30:00Z", JobState::Retryable, 1),
            row("2026-12-01T10:29:00Z", JobState::Discarded, 2),
            row("2026-12-01T09:30:00Z", JobState::Completed, 7),
        ];
        let b = buckets(&h, now, chrono::TimeDelta::minutes(1), 60);
        assert_eq!(
            b[59],
            Bucket {
                completed: 3,
                failed: 1
            }
        );
        assert_eq!(
            b[58],
            Bucket {
                completed: 0,
                failed: 2
            }
        );
        assert_eq!(
            b.iter().map(|b| b.completed).sum::<u64>(),
            3,
            "an hour ago is out"
        );
        let d = buckets(&h, now, chrono::TimeDelta::minutes(30), 48);
        assert_eq!(
            d[47],
            Bucket {
                completed: 3,
                failed: 1
            }
        );
        assert_eq!(
            d[46],
            Bucket {
                completed: 0,
                failed: 2
            }
        );
        assert_eq!(d[45].completed, 7);
    }

    #[test]
    fn bars_carry_their_numbers_for_screen_readers_and_hover() {
        let data = [
            Bucket {
                completed: 4,
                failed: 1,
            },
            Bucket::default(),
        ];
        let html = bars("Last hour", &data, |i| format!("b{i}"), ("1 h ago", "now")).into_string();
        assert!(
            html.contains("aria-label=\"Last hour: 4 completed, 1 failed attempts\""),
            "{html}"
        );
        assert!(
            html.contains("<title>b0: 4 completed, 1 failed</title>"),
            "{html}"
        );
        assert_eq!(html.matches("<rect").count(), 2, "{html}");
    }
}
