//! The CRD installs through kubectl and its CEL rules reject bad resources with their message.

use super::*;

#[test]
fn crd_installs_and_cel_rules_reject_bad_resources_with_their_message() {
    run(async {
        let cp = ControlPlane::start();
        cp.install_crds();
        let good = r#"
apiVersion: scheduling.program-router.dev/v1alpha1
kind: ProgramScheduling
metadata: {name: good, namespace: default}
spec:
  workerSelector: {matchLabels: {app: vllm}}
  programScheduling: {lowWatermarkRatio: 0.5, highWatermarkRatio: 0.9}
"#;
        cp.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], Some(good))
            .expect_ok("a valid resource is accepted");
        // `kubectl explain` serves the descriptions (operator/tests/crds.rs checks that every
        // field has one): the resource's and a few deep fields'.
        for (path, says) in [
            ("psched", "vLLM worker pods"),
            ("psched.spec.programScheduling.maxActingTtlSeconds", "tool"),
            ("psched.spec.fairness.classes.onlyWhenIdle", "waiting queue"),
            ("psched.spec.router.image", "--router-image"),
            ("psched.status.observedGeneration", "generation"),
        ] {
            let out = cp.kubectl(&["explain", path]).expect_ok("kubectl explain");
            // kubectl wraps the text at its own width.
            let flat = out.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(flat.contains(says), "kubectl explain {path}:\n{out}");
        }
        for (bad, message) in [
            (
                "programScheduling: {lowWatermarkRatio: 0.9, highWatermarkRatio: 0.5}",
                "lowWatermarkRatio must not exceed highWatermarkRatio",
            ),
            (
                "programScheduling: {bindingStrategy: reasoning_token_balance}",
                "reasoning_token_balance requires tokenCapacityPerDpRank",
            ),
            (
                "router: {policy: fastest}",
                "router.policy must be round_robin",
            ),
            ("workerPort: 70000", "workerPort must be a TCP port"),
            (
                "router: {sessionAffinity: Sticky}",
                "router.sessionAffinity must be None or ClientIP",
            ),
            (
                "fairness: {defaultRateLimit: {tokensPerMinute: 0}}",
                "tokensPerMinute must be positive",
            ),
            (
                "router: {maxConcurrentRequests: 0}",
                "router.maxConcurrentRequests must be at least 1",
            ),
            (
                "router: {queueTimeoutSeconds: 0}",
                "router.queueTimeoutSeconds must be positive",
            ),
            (
                "fairness: {discipline: lottery}",
                "fairness.discipline must be vtc or round_robin",
            ),
            (
                "programScheduling: {resumeOrder: lifo}",
                "resumeOrder must be mru or fcfs",
            ),
            (
                "programScheduling: {forceResumeWorkloadFactor: -1}",
                "forceResumeWorkloadFactor must be >= 0",
            ),
            (
                "programScheduling: {crossRankMinWaitRatio: -0.5}",
                "crossRankMinWaitRatio must be >= 0",
            ),
            (
                "programScheduling: {missImpactBacklogWeight: -1}",
                "missImpactBacklogWeight must be >= 0",
            ),
        ] {
            let doc = format!(
                "apiVersion: scheduling.program-router.dev/v1alpha1\nkind: ProgramScheduling\n\
                 metadata: {{name: bad, namespace: default}}\nspec:\n  workerSelector: {{}}\n  {bad}\n"
            );
            let out = cp.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], Some(&doc));
            assert!(!out.ok, "{bad} must be rejected");
            assert!(
                out.stderr.contains(message),
                "{bad}: expected {message:?} in {:?}",
                out.stderr
            );
        }
        let printed = cp
            .kubectl(&[
                "get",
                "crd",
                "programschedulings.scheduling.program-router.dev",
                "-o",
                "jsonpath={.spec.names.shortNames}",
            ])
            .expect_ok("short name");
        assert!(printed.contains("psched"), "{printed}");
    });
}
