# syntax=docker/dockerfile:1
# Images for the two production binaries. Build one with its target:
#   docker build --target program-router   -t ghcr.io/program-scheduling/program-router:0.1.0 .
#   docker build --target program-operator -t ghcr.io/program-scheduling/program-operator:0.1.0 .
# Both run as the distroless `nonroot` user (65532) with no shell; the chart's and the operator's
# pod specs add a read-only root filesystem and drop every capability.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p program-router -p program-operator --bin program-router --bin program-operator \
 && mkdir -p /out \
 && cp target/release/program-router target/release/program-operator /out/

FROM gcr.io/distroless/cc-debian12:nonroot AS program-router
COPY --from=build /out/program-router /usr/local/bin/program-router
USER 65532:65532
EXPOSE 8080 29000
ENTRYPOINT ["/usr/local/bin/program-router"]

FROM gcr.io/distroless/cc-debian12:nonroot AS program-operator
COPY --from=build /out/program-operator /usr/local/bin/program-operator
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/program-operator"]
