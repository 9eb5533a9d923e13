//! Where log lines go: a bounded in-memory buffer that a writer thread empties to stderr every
//! few milliseconds in one `write`, so a request's thread formats its line, appends it under a
//! short lock and moves on, instead of making a system call per line (an access line per request
//! made that a cost of every request). A full buffer ([`MAX_BUFFERED_BYTES`]) drops the line and
//! counts it ([`dropped`]); [`flush`] waits for the buffer to be written before the process
//! exits.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// Bytes of log lines waiting for the writer thread at most.
pub const MAX_BUFFERED_BYTES: usize = 4 * 1024 * 1024;
/// How often the writer thread writes what gathered.
const PERIOD: Duration = Duration::from_millis(5);

static DROPPED: AtomicU64 = AtomicU64::new(0);
static BUFFER: Mutex<Vec<u8>> = Mutex::new(Vec::new());
static WRITER: Once = Once::new();

/// Lines dropped because the buffer was full, since the process started.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

fn start_writer() {
    WRITER.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(|| {
                let mut spare = Vec::new();
                loop {
                    std::thread::sleep(PERIOD);
                    write_out(&mut spare);
                }
            });
    });
}

/// Swaps the buffer for `spare` and writes what it held.
fn write_out(spare: &mut Vec<u8>) {
    {
        let mut b = BUFFER.lock().unwrap_or_else(|p| p.into_inner());
        if b.is_empty() {
            return;
        }
        std::mem::swap(&mut *b, spare);
    }
    let _ = std::io::stderr().write_all(spare);
    spare.clear();
}

/// Writes what the buffer holds now, waiting at most `max` for the writer thread's turn.
pub fn flush(max: Duration) {
    let until = Instant::now() + max;
    loop {
        let empty = BUFFER.lock().map(|b| b.is_empty()).unwrap_or(true);
        if empty || Instant::now() >= until {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Flushes the log (up to 2 s) when dropped: held by `main`, so every return writes the lines
/// buffered before it.
pub struct FlushOnExit;

impl Drop for FlushOnExit {
    fn drop(&mut self) {
        flush(Duration::from_secs(2));
    }
}

/// Where one event's line goes: what it is handed is appended to the buffer as one piece (the
/// log's layer formats the whole line first and hands it over in one write), or dropped whole
/// and counted when the buffer is full.
pub struct Line;

impl Write for Line {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if b.is_empty() {
            return Ok(0);
        }
        let mut buf = BUFFER.lock().unwrap_or_else(|p| p.into_inner());
        if buf.len() + b.len() > MAX_BUFFERED_BYTES {
            drop(buf);
            DROPPED.fetch_add(1, Ordering::Relaxed);
        } else {
            buf.extend_from_slice(b);
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The `MakeWriter` of the log: a [`Line`] per event.
pub struct Buffered;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buffered {
    type Writer = Line;
    fn make_writer(&'a self) -> Line {
        start_writer();
        Line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::fmt::MakeWriter;

    #[test]
    fn lines_are_written_by_the_writer_thread_and_flush_waits_for_them() {
        for i in 0..100 {
            let mut l = Buffered.make_writer();
            let _ = writeln!(l, "log-writer test line {i}");
        }
        flush(Duration::from_secs(5));
        assert!(BUFFER.lock().expect("buffer").is_empty());
        assert_eq!(dropped(), 0);
    }
}
