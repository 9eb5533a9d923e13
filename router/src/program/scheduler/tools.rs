//! Tool-aware TTL evidence: completion-to-next-request intervals kept per tool the completion
//! called, so that a Program about to run a slow tool is not held like one about to read a file.
//!
//! The label is the name of the first tool call in a response (the data plane reads it); the
//! interval that follows is pushed into that tool's window when the Program's next request
//! arrives. Names are untrusted (a model chose them from a client's tool list): at most
//! `max_tools` distinct names are kept, each cut to [`MAX_TOOL_NAME_BYTES`]; later names go
//! unlabeled (the scheduler counts them in a `Shed` note).

use rustc_hash::FxHashMap;

use super::Window;

/// The longest tool name kept, in bytes (longer names are cut at a character boundary).
pub const MAX_TOOL_NAME_BYTES: usize = 64;

/// A tool's index in [`Tools`].
pub type ToolId = u16;

/// Per-tool interval windows, bounded in count and name length.
#[derive(Debug, Clone)]
pub struct Tools {
    index: FxHashMap<Box<str>, ToolId>,
    windows: Vec<Window>,
    cap: usize,
    window: usize,
}

impl Tools {
    pub fn new(cap: u32, window: usize) -> Self {
        Tools {
            index: FxHashMap::default(),
            windows: Vec::new(),
            cap: (cap as usize).min(usize::from(ToolId::MAX)),
            window,
        }
    }

    /// A new cap: tools already kept stay; new names are kept only below it.
    pub fn set_cap(&mut self, cap: u32) {
        self.cap = (cap as usize).min(usize::from(ToolId::MAX));
    }

    /// The id of tool `name`, kept on first sight while fewer than the cap are kept.
    pub fn label(&mut self, name: &str) -> Option<ToolId> {
        let name = truncate(name, MAX_TOOL_NAME_BYTES);
        if let Some(&id) = self.index.get(name) {
            return Some(id);
        }
        if self.windows.len() >= self.cap {
            return None;
        }
        let id = ToolId::try_from(self.windows.len()).ok()?;
        self.index.insert(name.into(), id);
        self.windows.push(Window::new(self.window));
        Some(id)
    }

    pub fn push(&mut self, id: ToolId, interval: f64) {
        if let Some(w) = self.windows.get_mut(usize::from(id)) {
            w.push(interval);
        }
    }

    /// Tool `id`'s intervals once they hold `needed` samples.
    pub fn evidence(&self, id: ToolId, needed: usize) -> Option<&Window> {
        self.windows
            .get(usize::from(id))
            .filter(|w| needed > 0 && w.len() >= needed)
    }

    /// Distinct tool names kept.
    pub fn len(&self) -> usize {
        self.windows.len()
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_bounded_in_count_and_length() {
        let mut t = Tools::new(2, 10);
        let a = t.label("read_file");
        assert_eq!(a, Some(0));
        assert_eq!(t.label("read_file"), a);
        assert_eq!(t.label(&"é".repeat(40)), Some(1));
        // The cut name is the same tool however long the original was.
        assert_eq!(t.label(&"é".repeat(50)), Some(1));
        assert_eq!(t.label("run_tests"), None);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn evidence_waits_for_its_samples() {
        let mut t = Tools::new(4, 10);
        let id = t.label("x").unwrap_or_default();
        for i in 0..3 {
            assert!(t.evidence(id, 4).is_none());
            t.push(id, f64::from(i));
        }
        t.push(id, 9.0);
        assert_eq!(t.evidence(id, 4).map(Window::len), Some(4));
        assert!(t.evidence(id, 0).is_none(), "0 turns tool evidence off");
    }
}
