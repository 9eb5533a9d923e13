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
            // Allowed values are a schema enum, which explain lists.
            (
                "psched.spec.router.policy",
                "ENUM: round_robin random consistent_hash",
            ),
            (
                "psched.spec.router.logLevel",
                "ENUM: error warn info debug trace",
            ),
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
                "spec.router.policy: Unsupported value: \"fastest\": supported values: \"round_robin\"",
            ),
            (
                "router: {tracing: {otlpTracesEndpoint: 'grpc://collector:4317'}}",
                "router.tracing.otlpTracesEndpoint must be an http:// URL",
            ),
            (
                "router: {tracing: {otlpTracesEndpoint: 'http://collector:4317', samplingRatio: 2}}",
                "router.tracing.samplingRatio must be within 0 and 1",
            ),
            (
                "router: {logLevel: verbose}",
                "spec.router.logLevel: Unsupported value: \"verbose\"",
            ),
            (
                "router: {podLabels: {app.kubernetes.io/instance: other}}",
                "router.podLabels must not set app.kubernetes.io/name",
            ),
            (
                "router: {podAnnotations: {scheduling.program-router.dev/restart-hash: x}}",
                "router.podAnnotations must not set the operator's",
            ),
            ("workerPort: 70000", "workerPort must be a TCP port"),
            (
                "router: {sessionAffinity: Sticky}",
                "spec.router.sessionAffinity: Unsupported value: \"Sticky\"",
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
                "spec.fairness.discipline: Unsupported value: \"lottery\"",
            ),
            (
                "programScheduling: {resumeOrder: lifo}",
                "spec.programScheduling.resumeOrder: Unsupported value: \"lifo\"",
            ),
            (
                "programScheduling: {forceResumeWorkloadFactor: -1}",
                "forceResumeWorkloadFactor must be >= 0",
            ),
            (
                "programScheduling: {forceResumeEngineGraceSeconds: -1}",
                "forceResumeEngineGraceSeconds must be >= 0",
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
        let (fields, missing) = undescribed_in_explain(&cp);
        assert!(
            fields > 150,
            "kubectl explain --recursive listed {fields} fields"
        );
        assert!(
            missing.is_empty(),
            "fields kubectl explain shows without a description: {missing:?}"
        );
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

/// Walks every field `kubectl explain psched --recursive` lists and looks up the description the
/// API server publishes for it (what `kubectl explain <field>` prints): (fields, undescribed).
fn undescribed_in_explain(cp: &ControlPlane) -> (usize, Vec<String>) {
    let tree = cp
        .kubectl(&["explain", "psched", "--recursive"])
        .expect_ok("kubectl explain --recursive");
    let doc = cp
        .kubectl(&[
            "get",
            "--raw",
            "/openapi/v3/apis/scheduling.program-router.dev/v1alpha1",
        ])
        .expect_ok("the published OpenAPI v3 document");
    let doc: serde_json::Value = serde_json::from_str(&doc).expect("json");
    let schemas = &doc["components"]["schemas"];
    let root = &schemas["dev.program-router.scheduling.v1alpha1.ProgramScheduling"];
    assert!(root.is_object(), "the resource's schema is published");
    let deref = |s: &serde_json::Value| deref_schema(schemas, s);
    // What explain descends into below a field: its items' or values' object.
    let inner = |s: serde_json::Value| -> serde_json::Value {
        let s = deref(&s);
        for k in ["items", "additionalProperties"] {
            if s.get(k)
                .is_some_and(|i| deref(i).get("properties").is_some())
            {
                return deref(&s[k]);
            }
        }
        s
    };
    let mut stack: Vec<(String, serde_json::Value)> = Vec::new();
    let (mut fields, mut missing) = (0, Vec::new());
    let mut in_fields = false;
    for line in tree.lines() {
        if line.starts_with("FIELDS:") {
            in_fields = true;
            continue;
        }
        let Some((name, _kind)) = line.trim_start().split_once('\t') else {
            continue;
        };
        if !in_fields || name.is_empty() {
            continue;
        }
        let depth = (line.len() - line.trim_start().len()) / 2 - 1;
        stack.truncate(depth);
        let parent = match stack.last() {
            Some((_, s)) => inner(s.clone()),
            None => root.clone(),
        };
        let field = deref(&parent["properties"][name]);
        let path: Vec<&str> = stack
            .iter()
            .map(|(n, _)| n.as_str())
            .chain([name])
            .collect();
        fields += 1;
        if field["description"]
            .as_str()
            .is_none_or(|d| d.trim().is_empty())
        {
            missing.push(path.join("."));
        }
        stack.push((name.to_string(), field));
    }
    (fields, missing)
}

/// A field's own schema in a published OpenAPI document: `$ref` (also inside `allOf`) followed,
/// the field's own keys (its description) kept over the referenced type's.
fn deref_schema<'a>(
    schemas: &'a serde_json::Value,
    mut s: &'a serde_json::Value,
) -> serde_json::Value {
    let mut merged = serde_json::Map::new();
    for _ in 0..8 {
        if let Some(o) = s.as_object() {
            for (k, v) in o {
                merged.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        let r = s["$ref"]
            .as_str()
            .or_else(|| s["allOf"][0]["$ref"].as_str());
        match r.and_then(|r| r.strip_prefix("#/components/schemas/")) {
            Some(name) => s = &schemas[name],
            None => break,
        }
    }
    serde_json::Value::Object(merged)
}
