# kvrouter: one static binary on distroless, run as non-root.
#   docker build --build-arg VERSION=v0.1.0 -t kvrouter:v0.1.0 .
#   docker run --rm -p 8000:8000 kvrouter:v0.1.0 serve --listen 0.0.0.0:8000 --backend http://vllm:8000
# scripts/release.sh builds it so, with the binaries; without VERSION the
# binary reports "(devel)" (the image has no .git to stamp a commit from).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w -X main.version=$VERSION" -o /out/kvrouter ./cmd/kvrouter

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=
LABEL org.opencontainers.image.title="kvrouter" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.source="https://github.com/kvrouter/kvrouter"
COPY --from=build /out/kvrouter /kvrouter
# The API (serve), the endpoint picker's gRPC (epp), the admin surface.
EXPOSE 8000 9002 9091
USER 65532:65532
ENTRYPOINT ["/kvrouter"]
CMD ["serve", "--listen", "0.0.0.0:8000"]
