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
    started: bool,
}

impl<F: Future> Quiet<F> {
    pub(super) fn new(inner: F) -> Self {
        let signal = Arc::new(Signal::default());
        Quiet {
            inner: Box::pin(inner),
            waker: Waker::from(signal.clone()),
            signal,
            started: false,
        }
    }
}

impl<F: Future> Future for Quiet<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Registered before the flag is read: a wake between the two is not lost.
        self.signal.task.register(cx.waker());
        let fired = self.signal.fired.swap(false, Ordering::Acquire);
        if self.started && !fired {
            return Poll::Pending;
        }
        self.started = true;
        let this = &mut *self;
        this.inner
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Counts its polls; ready once `open` is set, and wakes its last waker when told to.
    struct Gate {
        polls: Arc<AtomicUsize>,
        open: Arc<AtomicBool>,
        waker: Arc<std::sync::Mutex<Option<Waker>>>,
    }

    impl Future for Gate {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            if self.open.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            *self.waker.lock().expect("lock") = Some(cx.waker().clone());
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

    #[test]
    fn the_inner_future_is_polled_only_when_it_woke_and_its_wake_reaches_the_task() {
        let polls = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicBool::new(false));
        let inner_waker = Arc::new(std::sync::Mutex::new(None::<Waker>));
        let mut q = Box::pin(Quiet::new(Gate {
            polls: polls.clone(),
            open: open.clone(),
            waker: inner_waker.clone(),
        }));
        let task = Arc::new(Count::default());
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);

        assert!(q.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 1, "the first poll reaches it");
        // The task woke for something else (the connection): the gate is not polled.
        for _ in 0..5 {
            assert!(q.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::SeqCst), 1);

        // The gate opens and wakes: the task is woken, and the next poll reaches the gate.
        open.store(true, Ordering::SeqCst);
        let w = inner_waker
            .lock()
            .expect("lock")
            .take()
            .expect("registered");
        w.wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "the task was woken");
        assert!(q.as_mut().poll(&mut cx).is_ready());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_wake_before_the_task_polls_again_is_kept() {
        let polls = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicBool::new(false));
        let inner_waker = Arc::new(std::sync::Mutex::new(None::<Waker>));
        let mut q = Box::pin(Quiet::new(Gate {
            polls: polls.clone(),
            open: open.clone(),
            waker: inner_waker.clone(),
        }));
        let task = Arc::new(Count::default());
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(q.as_mut().poll(&mut cx).is_pending());
        // Woken (not yet open): the next poll reaches the gate, which waits again.
        inner_waker
            .lock()
            .expect("lock")
            .take()
            .expect("registered")
            .wake();
        assert!(q.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        // A task polled with a new waker still gets the gate's wake.
        let task2 = Arc::new(Count::default());
        let waker2 = Waker::from(task2.clone());
        assert!(
            q.as_mut()
                .poll(&mut Context::from_waker(&waker2))
                .is_pending()
        );
        open.store(true, Ordering::SeqCst);
        inner_waker
            .lock()
            .expect("lock")
            .take()
            .expect("registered")
            .wake();
        assert_eq!(
            task2.0.load(Ordering::SeqCst),
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
