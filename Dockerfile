# kvrouter: one static binary on distroless, run as non-root.
#   docker build -t kvrouter:latest .
#   docker run --rm -p 8000:8000 kvrouter:latest serve --listen 0.0.0.0:8000 --backend http://vllm:8000
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH=amd64
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags='-s -w' -o /out/kvrouter ./cmd/kvrouter

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kvrouter /kvrouter
# The API (serve), the endpoint picker's gRPC (epp), the admin surface.
EXPOSE 8000 9002 9091
USER 65532:65532
ENTRYPOINT ["/kvrouter"]
CMD ["serve", "--listen", "0.0.0.0:8000"]
