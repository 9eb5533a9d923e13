//! Watches the `--config` file by polling its content.
//!
//! Polling the bytes (not inotify) is deliberate: Kubernetes ConfigMap volumes update through an
//! atomic swap of a symlinked directory, which file-event watchers miss or report on the wrong
//! path, while a content poll sees every change on every filesystem. A change is delivered once
//! it has been stable for one debounce period, so a half-written file is not applied.

use std::path::PathBuf;
use std::time::Duration;

/// What the watcher reports.
#[derive(Debug, Clone, PartialEq)]
pub enum FileEvent {
    /// New, stable content.
    Changed(Vec<u8>),
    /// The file cannot be read (reported once per distinct error).
    Unreadable(String),
}

fn digest(b: &[u8]) -> u64 {
    crate::hash::fnv1a(b) ^ (b.len() as u64).rotate_left(32)
}

/// Polls `path` every `interval` and calls `on_event` for each change after the content the
/// router started with (`initial`). Runs until `stop` resolves.
pub async fn watch(
    path: PathBuf,
    initial: Option<Vec<u8>>,
    interval: Duration,
    debounce: Duration,
    mut on_event: impl FnMut(FileEvent),
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut last = initial.as_deref().map(digest);
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = &mut stop => return,
        }
        let first = match tokio::fs::read(&path).await {
            Ok(b) => b,
            Err(e) => {
                let msg = format!("cannot read {}: {e}", path.display());
                if last_error.as_ref() != Some(&msg) {
                    on_event(FileEvent::Unreadable(msg.clone()));
                    last_error = Some(msg);
                }
                continue;
            }
        };
        last_error = None;
        let d = digest(&first);
        if Some(d) == last {
            continue;
        }
        tokio::time::sleep(debounce).await;
        match tokio::fs::read(&path).await {
            Ok(second) if digest(&second) == d => {
                last = Some(d);
                on_event(FileEvent::Changed(second));
            }
            // Still changing: look again on the next poll.
            _ => continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reports_changes_once_and_survives_atomic_renames() {
        let dir = std::env::temp_dir().join(format!("watch-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("config.json");
        std::fs::write(&path, b"one").expect("write");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(watch(
            path.clone(),
            Some(b"one".to_vec()),
            Duration::from_millis(10),
            Duration::from_millis(5),
            move |e| {
                let _ = tx.send(e);
            },
            async move {
                let _ = stop_rx.await;
            },
        ));
        // Replace by rename, as ConfigMap volumes and editors do.
        let tmp = dir.join("config.json.tmp");
        std::fs::write(&tmp, b"two").expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
        let ev = tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .expect("event")
            .expect("open");
        assert_eq!(ev, FileEvent::Changed(b"two".to_vec()));
        std::fs::remove_file(&path).expect("rm");
        let ev = tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .expect("event")
            .expect("open");
        assert!(matches!(ev, FileEvent::Unreadable(_)));
        std::fs::write(&path, b"two").expect("write");
        // Same content as before the removal: nothing new to apply.
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert!(rx.try_recv().is_err());
        let _ = stop_tx.send(());
        task.await.expect("stops");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
