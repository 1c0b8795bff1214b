package deploy

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvrouter/kvrouter/epp"
)

// TestEnvoyConfig: the sample envoy.yaml is a valid Envoy bootstrap (its
// protobuf, unknown fields rejected, and the API's validation rules), and
// it wires the ext_proc filter to the picker's Service and port in a body
// mode the picker routes on, forwarding to the header the picker sets.
func TestEnvoyConfig(t *testing.T) {
	data, err := os.ReadFile("epp/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	for _, typo := range [][2]string{{"use_http_header", "use_http_headr"}, {"FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAM"}} {
		bad, _ := yaml.YAMLToJSON([]byte(strings.Replace(string(data), typo[0], typo[1], 1)))
		if err := protojson.Unmarshal(bad, new(bootstrapv3.Bootstrap)); err == nil {
			t.Errorf("%s → %s decoded without error: the check tests nothing", typo[0], typo[1])
		}
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	var hcm hcmv3.HttpConnectionManager
	if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	var ep extprocfilter.ExternalProcessor
	for _, f := range hcm.GetHttpFilters() {
		if f.GetName() == "envoy.filters.http.ext_proc" {
			if err := f.GetTypedConfig().UnmarshalTo(&ep); err != nil {
				t.Fatal(err)
			}
		}
	}
	pm := ep.GetProcessingMode()
	if m := pm.GetRequestBodyMode(); m != extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED && m != extprocfilter.ProcessingMode_BUFFERED {
		t.Errorf("request_body_mode %s: the picker routes on BUFFERED or FULL_DUPLEX_STREAMED", m)
	}
	if pm.GetResponseBodyMode() == extprocfilter.ProcessingMode_NONE {
		t.Error("response_body_mode NONE: the picker would not see the response end, and hold the engine's load until the stream closes")
	}
	picker := clusters[ep.GetGrpcService().GetEnvoyGrpc().GetClusterName()]
	if picker == nil || picker.GetTypedExtensionProtocolOptions() == nil {
		t.Fatalf("ext_proc cluster %q: missing, or without HTTP/2 options", ep.GetGrpcService().GetEnvoyGrpc().GetClusterName())
	}
	sa := picker.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	s := load(t)
	svc := s.services[sa.GetAddress()]
	if svc == nil || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return uint32(p.Port) == sa.GetPortValue() }) {
		t.Errorf("ext_proc cluster dials %s:%d: no such Service port in the manifests", sa.GetAddress(), sa.GetPortValue())
	}
	var original *clusterv3.Cluster
	for _, c := range clusters {
		if c.GetType() == clusterv3.Cluster_ORIGINAL_DST {
			original = c
		}
	}
	if h := original.GetOriginalDstLbConfig(); !h.GetUseHttpHeader() || h.GetHttpHeaderName() != epp.DefaultHeader {
		t.Errorf("ORIGINAL_DST cluster header %q (use %v), want %s", h.GetHttpHeaderName(), h.GetUseHttpHeader(), epp.DefaultHeader)
	}
}

// TestDockerfile: the image is a static binary (CGO off) on distroless or
// scratch, runs as the non-root user the manifests expect, and exposes
// the ports they use.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(data)
	froms := regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindAllStringSubmatch(df, -1)
	if len(froms) < 2 {
		t.Fatalf("got %d stages, want a multi-stage build", len(froms))
	}
	if last := froms[len(froms)-1][1]; !strings.HasPrefix(last, "gcr.io/distroless/static") && last != "scratch" {
		t.Errorf("final stage %s: want distroless static or scratch", last)
	}
	if !regexp.MustCompile(`CGO_ENABLED=0\b`).MatchString(df) {
		t.Error("the binary is not built with CGO_ENABLED=0")
	}
	if uid := dockerUID(t); uid == 0 {
		t.Error("USER is root")
	}
	exposed := regexp.MustCompile(`(?m)^EXPOSE\s+(.+)$`).FindStringSubmatch(df)
	if exposed == nil {
		t.Fatal("no EXPOSE")
	}
	for _, d := range load(t).deployments {
		c := d.Spec.Template.Spec.Containers[0]
		if name, _, _ := strings.Cut(c.Image, ":"); name != "kvrouter" {
			continue // another image's (redis.yaml)
		}
		for _, p := range c.Ports {
			if !slices.Contains(strings.Fields(exposed[1]), strconv.Itoa(int(p.ContainerPort))) {
				t.Errorf("%s uses port %d, which the image does not EXPOSE (%s)", d.Name, p.ContainerPort, exposed[1])
			}
		}
	}
}

// dockerUID is the numeric user of the image's last USER line.
func dockerUID(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^USER\s+(\d+)`).FindAllStringSubmatch(string(data), -1)
	if m == nil {
		t.Fatal("Dockerfile: no numeric USER (Kubernetes' runAsNonRoot needs a numeric one)")
	}
	uid, _ := strconv.ParseInt(m[len(m)-1][1], 10, 64)
	return uid
}
