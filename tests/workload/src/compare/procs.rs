//! Starting the processes of a comparison: routers and simulators, logged, on checked ports.

use super::*;

pub(crate) fn spawn(bin: &Path, args: &[String]) -> Result<Child, String> {
    spawn_logged(bin, args, None)
}

/// Starts `bin` with its output appended to `log`, or discarded without one.
pub(crate) fn spawn_logged(
    bin: &Path,
    args: &[String],
    log: Option<&Path>,
) -> Result<Child, String> {
    let (out, err) = match log {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
            let copy = file.try_clone().map_err(|e| e.to_string())?;
            (Stdio::from(file), Stdio::from(copy))
        }
        None => (Stdio::null(), Stdio::null()),
    };
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))
}

/// Starts a simulator on `port` with `flags` (`--name value`, plus `--log-level warn`), waits
/// for its `/health` and returns its base URL. The process joins `procs`, which stops it.
pub(crate) fn start_sim(
    procs: &mut Procs,
    bin_dir: &Path,
    port: u16,
    flags: &[(&str, String)],
) -> Result<String, String> {
    let mut args = vec![
        "--port".to_string(),
        port.to_string(),
        "--log-level".into(),
        "warn".into(),
    ];
    // An empty value is a flag without one.
    for (name, value) in flags {
        args.push(format!("--{name}"));
        if !value.is_empty() {
            args.push(value.clone());
        }
    }
    procs.0.push(spawn(&bin_dir.join("vllm-sim"), &args)?);
    let url = format!("http://127.0.0.1:{port}");
    if !wait_ok(&format!("{url}/health"), 20.0) {
        let exited = procs
            .0
            .last_mut()
            .and_then(|c| c.try_wait().ok().flatten())
            .map(|st| format!(" (it exited: {st})"))
            .unwrap_or_default();
        return Err(format!("simulator on {port} did not start{exited}"));
    }
    Ok(url)
}
