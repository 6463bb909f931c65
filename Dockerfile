# syntax=docker/dockerfile:1
#
# Images for the two daemons, one target each:
#   docker build --target edged -t iop/edged .
#   docker build --target noded -t iop/noded .
# Static binaries on a distroless base, running as a non-root user, with a
# health check that uses the daemon's own `healthcheck` command (no shell).

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ENV CGO_ENABLED=0
RUN go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/edged ./edged \
 && go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/noded ./noded

# The Edge: QUIC for Nodes on 7443/udp, HTTP for clients and admin on 8080.
# Mount its config (and certificates, in managed mode) at /etc/iop; the
# config must set listen.http to 0.0.0.0:8080 to be reachable from outside.
FROM gcr.io/distroless/static-debian12:nonroot AS edged
COPY --from=build /out/edged /usr/local/bin/edged
USER nonroot:nonroot
EXPOSE 7443/udp 8080/tcp
HEALTHCHECK --interval=15s --timeout=6s --start-period=10s --retries=3 \
  CMD ["/usr/local/bin/edged", "healthcheck", "--url", "http://127.0.0.1:8080/healthz"]
ENTRYPOINT ["/usr/local/bin/edged"]
CMD ["run", "--config", "/etc/iop/edge.yaml"]

# The Node: dials the Edge (no inbound port); health endpoints on
# 127.0.0.1:9090 for the container health check. Ready means registered and
# ready at the Edge.
FROM gcr.io/distroless/static-debian12:nonroot AS noded
COPY --from=build /out/noded /usr/local/bin/noded
USER nonroot:nonroot
HEALTHCHECK --interval=15s --timeout=6s --start-period=20s --retries=3 \
  CMD ["/usr/local/bin/noded", "healthcheck", "--url", "http://127.0.0.1:9090/readyz"]
ENTRYPOINT ["/usr/local/bin/noded"]
CMD ["run", "--config", "/etc/iop/node.yaml", "--health-addr", "127.0.0.1:9090"]
