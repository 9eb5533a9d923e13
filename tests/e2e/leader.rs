//! Leader election: one controller runs, and a standby takes over when the leader stops.

use super::*;

#[test]
fn leader_election_runs_one_controller_and_hands_over() {
    run(async {
        let cp = ControlPlane::start();
        cp.install_crds();
        let scratch = Scratch::new("lease");
        let args = [
            "--leader-elect",
            "--lease-namespace",
            "default",
            "--lease-duration-secs",
            "6",
        ];
        let a = Operator::start(
            &cp,
            &scratch.0,
            &[&args[..], &["--identity", "op-a"]].concat(),
        );
        let b = Operator::start(
            &cp,
            &scratch.0,
            &[&args[..], &["--identity", "op-b"]].concat(),
        );
        let leaders = || async {
            let (la, lb) = (
                a.counter("program_operator_leader").await,
                b.counter("program_operator_leader").await,
            );
            (la + lb == 1.0).then_some(if la == 1.0 { 'a' } else { 'b' })
        };
        let first = wait_for(Duration::from_secs(30), leaders)
            .await
            .unwrap_or_else(|| panic!("one leader:\n{}\n{}", a.log_tail(), b.log_tail()));
        // Exactly one stays leader, and the Lease names it.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(leaders().await, Some(first), "leadership is stable");
        let holder = cp
            .kubectl(&[
                "get",
                "lease",
                "program-operator",
                "-n",
                "default",
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ])
            .expect_ok("lease");
        assert_eq!(holder, format!("op-{first}"));
        // Both answer /readyz (a standby is healthy).
        let c = testkit::client();
        for op in [&a, &b] {
            let url = op.metrics_url.replace("/metrics", "/readyz");
            assert_eq!(testkit::get(&c, &url).await.status, 200);
        }
        // The leader stops (and releases the lease): the standby takes over.
        let (leader, standby) = if first == 'a' { (a, b) } else { (b, a) };
        let t0 = Instant::now();
        leader.stop();
        let took = wait_for(Duration::from_secs(20), || async {
            (standby.counter("program_operator_leader").await == 1.0).then_some(t0.elapsed())
        })
        .await
        .unwrap_or_else(|| panic!("standby took over:\n{}", standby.log_tail()));
        eprintln!("leader handover: {:.1} s", took.as_secs_f64());
        standby.stop();
    });
}
