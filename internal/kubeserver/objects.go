package kubeserver

import (
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// CreateNamespace creates namespace ns.
func (s *Server) CreateNamespace(t testing.TB, ns string) {
	t.Helper()
	if err := s.Do(http.MethodPost, "/api/v1/namespaces", "", map[string]any{"metadata": map[string]any{"name": ns}}, nil); err != nil {
		t.Fatal(err)
	}
}

// CreatePod creates a pod with labels, as a Deployment's would be before
// any kubelet ran it: no IP, not ready.
func (s *Server) CreatePod(t testing.TB, ns, name string, labels map[string]string) {
	t.Helper()
	pod := map[string]any{
		"metadata": map[string]any{"name": name, "labels": labels},
		"spec":     map[string]any{"containers": []any{map[string]any{"name": "vllm", "image": "vllm/vllm-openai"}}},
	}
	if err := s.Do(http.MethodPost, "/api/v1/namespaces/"+ns+"/pods", "", pod, nil); err != nil {
		t.Fatal(err)
	}
}

// SetPodStatus sets what a kubelet would through the status
// subresource: Running with ip, its Ready condition ready.
func (s *Server) SetPodStatus(t testing.TB, ns, name, ip string, ready bool) {
	t.Helper()
	cond := "False"
	if ready {
		cond = "True"
	}
	now := time.Now().UTC().Format(time.RFC3339)
	patch := map[string]any{"status": map[string]any{
		"phase": "Running", "podIP": ip, "podIPs": []any{map[string]any{"ip": ip}},
		"conditions": []any{map[string]any{"type": "Ready", "status": cond, "lastTransitionTime": now}},
	}}
	if err := s.Do(http.MethodPatch, "/api/v1/namespaces/"+ns+"/pods/"+name+"/status", "application/merge-patch+json", patch, nil); err != nil {
		t.Fatal(err)
	}
}

// Delete deletes the object at path (a pod's: /api/v1/namespaces/NS/pods/NAME).
func (s *Server) Delete(t testing.TB, path string) {
	t.Helper()
	if err := s.Do(http.MethodDelete, path, "", nil, nil); err != nil {
		t.Fatal(err)
	}
}

// InstallPoolCRD installs the InferencePool CRD and waits until it is
// established and its collection answers in namespace ns.
func (s *Server) InstallPoolCRD(t testing.TB, ns string) {
	t.Helper()
	y, err := os.ReadFile(s.CRDFile)
	if err != nil {
		t.Fatal(err)
	}
	var crd map[string]any
	if err := yaml.Unmarshal(y, &crd); err != nil {
		t.Fatalf("%s: %v", s.CRDFile, err)
	}
	if err := s.Do(http.MethodPost, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "", crd, nil); err != nil {
		t.Fatal(err)
	}
	poll(t, "the InferencePool CRD served", func() bool {
		return s.Do(http.MethodGet, "/apis/inference.networking.k8s.io/v1/namespaces/"+ns+"/inferencepools", "", nil, nil) == nil
	})
}

// Create creates obj in the collection at path.
func (s *Server) Create(t testing.TB, path string, obj any) {
	t.Helper()
	if err := s.Do(http.MethodPost, path, "", obj, nil); err != nil {
		t.Fatal(fmt.Errorf("create in %s: %w", path, err))
	}
}

// Patch merge-patches the object at path.
func (s *Server) Patch(t testing.TB, path string, patch any) {
	t.Helper()
	if err := s.Do(http.MethodPatch, path, "application/merge-patch+json", patch, nil); err != nil {
		t.Fatal(err)
	}
}
