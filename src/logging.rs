//! leaderrun's own log lines, on stderr.
//!
//! Quiet by default (warnings and errors only), so a cron job whose lock was
//! taken by another host mails nothing: `-v` adds each step, `-vv` debug detail,
//! `-q` keeps errors only. Text lines read `leaderrun: warning: message key=value`.

use std::fmt;

use tracing::level_filters::LevelFilter;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::registry::LookupSpan;

use crate::cli::{CommonArgs, LogFormat};

pub fn init(common: &CommonArgs) {
    let level = match (common.quiet, common.verbose) {
        (true, _) => Level::ERROR,
        (false, 0) => Level::WARN,
        (false, 1) => Level::INFO,
        (false, 2) => Level::DEBUG,
        (false, _) => Level::TRACE,
    };
    // Only leaderrun's own events: the store clients (sqlx, async-nats, ...) stay silent below
    // -vvv. Their errors reach the user through leaderrun's own one-line messages; printed
    // as well, they would say the same thing twice, in another format (and break cron's quiet).
    let filter = tracing_subscriber::filter::Targets::new()
        .with_target("leaderrun", level)
        .with_default(if level == Level::TRACE { LevelFilter::DEBUG } else { LevelFilter::OFF });
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let result = match common.log_format {
        LogFormat::Text => tracing_subscriber::registry()
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(false).event_format(Text))
            .with(filter)
            .try_init(),
        LogFormat::Json => tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr)
                    .with_ansi(false)
                    .with_target(false),
            )
            .with(filter)
            .try_init(),
    };
    // A second init (tests) keeps the first subscriber; nothing to report.
    let _ = result;
}

/// `leaderrun: level: message key=value`
struct Text;

impl<S, N> FormatEvent<S, N> for Text
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let level = match *event.metadata().level() {
            Level::ERROR => "error",
            Level::WARN => "warning",
            Level::INFO => "info",
            Level::DEBUG => "debug",
            Level::TRACE => "trace",
        };
        write!(writer, "leaderrun: {level}: ")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}
