//! A future polled only when its own waker fired: [`Quiet`].
//!
//! A connection's task waits on its HTTP connection and, beside it, on the listener's stop and
//! the idle timer; `select!` polls every branch each time any of them wakes the task, which is
//! several times per request for the connection alone. Wrapped in [`Quiet`], the stop and the
//! timer are polled only after they woke the task themselves (or on the first poll), so a
//! request costs the branch an atomic swap and a waker check instead of a poll of a watch
//! channel and a timer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// The waker handed to the inner future: it marks that the inner future asked to be polled,
/// then wakes the task.
#[derive(Default)]
struct Signal {
    fired: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// `inner`, polled on the first poll and after each wake of its own; other polls return
/// `Pending` at once.
pub(super) struct Quiet<F> {
    inner: Pin<Box<F>>,
    signal: Arc<Signal>,
    waker: Waker,
    /// The task waker `signal` holds (none before the first poll and after each wake, which
    /// takes it): registered again only then or when the task's waker changes.
    registered: Option<Waker>,
    started: bool,
}

impl<F: Future> Quiet<F> {
    pub(super) fn new(inner: F) -> Self {
        let signal = Arc::new(Signal::default());
        Quiet {
            inner: Box::pin(inner),
            waker: Waker::from(signal.clone()),
            signal,
            registered: None,
            started: false,
        }
    }
}

impl<F: Future> Future for Quiet<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let fired = this.signal.fired.swap(false, Ordering::Acquire);
        let same = this
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()));
        // A wake takes the registered waker (and sets `fired` first), so without one since the
        // last registration `signal` still holds this task's: nothing to register. Registered
        // before the inner future is polled: a wake that came after the swap is seen by that
        // poll, and any later one reaches the task.
        if fired || !same {
            this.signal.task.register(cx.waker());
            this.registered = Some(cx.waker().clone());
        }
        if this.started && !fired {
            return Poll::Pending;
        }
        this.started = true;
        this.inner
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// What a [`Gate`] shares with its test: its polls, whether it is open, its last waker.
    #[derive(Default)]
    struct Shared {
        polls: AtomicUsize,
        open: AtomicBool,
        waker: Mutex<Option<Waker>>,
    }

    impl Shared {
        fn polls(&self) -> usize {
            self.polls.load(Ordering::SeqCst)
        }

        /// Wakes whoever the gate last registered.
        fn wake(&self) {
            let w = self.waker.lock().expect("lock").take();
            w.expect("registered").wake();
        }
    }

    /// Counts its polls; ready once open.
    struct Gate(Arc<Shared>);

    impl Future for Gate {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.0.polls.fetch_add(1, Ordering::SeqCst);
            if self.0.open.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            *self.0.waker.lock().expect("lock") = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    /// A task waker that counts its wakes.
    #[derive(Default)]
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn task() -> (Arc<Count>, Waker) {
        let t = Arc::new(Count::default());
        (t.clone(), Waker::from(t))
    }

    #[test]
    fn the_inner_future_is_polled_only_when_it_woke_and_its_wake_reaches_the_task() {
        let g = Arc::new(Shared::default());
        let mut q = Box::pin(Quiet::new(Gate(g.clone())));
        let (count, waker) = task();
        let mut cx = Context::from_waker(&waker);
        assert!(q.as_mut().poll(&mut cx).is_pending());
        assert_eq!(g.polls(), 1, "the first poll reaches it");
        // The task woke for something else (the connection): the gate is not polled.
        for _ in 0..5 {
            assert!(q.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(g.polls(), 1);
        // The gate opens and wakes: the task is woken, and the next poll reaches the gate.
        g.open.store(true, Ordering::SeqCst);
        g.wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "the task was woken");
        assert!(q.as_mut().poll(&mut cx).is_ready());
        assert_eq!(g.polls(), 2);
    }

    #[test]
    fn every_wake_reaches_the_task_not_only_the_first() {
        let g = Arc::new(Shared::default());
        let mut q = Box::pin(Quiet::new(Gate(g.clone())));
        let (count, waker) = task();
        let mut cx = Context::from_waker(&waker);
        for round in 1..=3 {
            assert!(q.as_mut().poll(&mut cx).is_pending());
            // Polls for the connection in between register nothing and lose nothing.
            assert!(q.as_mut().poll(&mut cx).is_pending());
            g.wake();
            assert_eq!(
                count.0.load(Ordering::SeqCst),
                round,
                "wake {round} reached the task"
            );
        }
        assert!(q.as_mut().poll(&mut cx).is_pending());
        assert_eq!(g.polls(), 4, "the first poll and one per wake");
    }

    #[test]
    fn a_wake_before_the_task_polls_again_is_kept_and_reaches_the_newest_task_waker() {
        let g = Arc::new(Shared::default());
        let mut q = Box::pin(Quiet::new(Gate(g.clone())));
        let (_, waker) = task();
        assert!(
            q.as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        // Woken (not yet open): the next poll reaches the gate, which waits again.
        g.wake();
        assert!(
            q.as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        assert_eq!(g.polls(), 2);
        // Polled from a task with a new waker: the gate's wake reaches that one.
        let (count2, waker2) = task();
        assert!(
            q.as_mut()
                .poll(&mut Context::from_waker(&waker2))
                .is_pending()
        );
        g.open.store(true, Ordering::SeqCst);
        g.wake();
        assert_eq!(
            count2.0.load(Ordering::SeqCst),
            1,
            "the newest task waker was woken"
        );
        assert!(
            q.as_mut()
                .poll(&mut Context::from_waker(&waker2))
                .is_ready()
        );
    }
}
