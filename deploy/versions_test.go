package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// semver is a release version as scripts/release.sh takes it.
var semver = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

// supported reads the "Supported versions" table of docs/kubernetes.md:
// the minimum of each row ("| Kubernetes | 1.30 | ... |").
func supported(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n### Supported versions\n")
	if !ok {
		t.Fatal(`docs/kubernetes.md has no "### Supported versions" section`)
	}
	out := map[string]string{}
	for _, l := range strings.Split(sec, "\n") {
		if strings.HasPrefix(l, "#") {
			break
		}
		f := strings.Split(l, "|")
		if len(f) >= 4 && !strings.Contains(f[2], "---") {
			out[strings.TrimSpace(f[1])] = strings.Trim(strings.TrimSpace(f[2]), "`")
		}
	}
	return out
}

// minor returns the minor version of "1.30" or "v1.0.0" as major*1000+minor.
func minor(t *testing.T, v string) int {
	t.Helper()
	f := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(f) < 2 {
		t.Fatalf("version %q: want MAJOR.MINOR", v)
	}
	maj, err1 := strconv.Atoi(f[0])
	min, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		t.Fatalf("version %q: want MAJOR.MINOR", v)
	}
	return maj*1000 + min
}

// needs is, for what the manifests use, the oldest version of each
// project that serves it ("1.30": Kubernetes 1.30).
var needs = []struct {
	project, what, since string
	used                 func(o object) bool
}{
	{"Kubernetes", "lifecycle.preStop.sleep (PodLifecycleSleepAction, on by default)", "1.30", func(o object) bool {
		d, ok := o.v.(*appsv1.Deployment)
		if !ok {
			return false
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if l := c.Lifecycle; l != nil && l.PreStop != nil && l.PreStop.Sleep != nil {
				return true
			}
		}
		return false
	}},
	{"Kubernetes", "autoscaling/v2", "1.23", func(o object) bool { return strings.HasPrefix(o.kind, "autoscaling/v2/") }},
	{"Kubernetes", "policy/v1 PodDisruptionBudget", "1.21", func(o object) bool { return strings.HasPrefix(o.kind, "policy/v1/") }},
	{"Gateway API", "gateway.networking.k8s.io/v1 HTTPRoute", "v1.0.0", func(o object) bool { return strings.HasPrefix(o.kind, "gateway.networking.k8s.io/v1/") }},
	{"Gateway API Inference Extension", "inference.networking.k8s.io/v1 InferencePool", "v1.0.0", func(o object) bool {
		return strings.HasPrefix(o.kind, "inference.networking.k8s.io/v1/")
	}},
}

// TestSupportedVersions: the minimum Kubernetes, Gateway API and
// Inference Extension versions docs/kubernetes.md states are at least
// those the manifests need (preStop.sleep needs Kubernetes 1.30; the v1
// HTTPRoute and InferencePool need v1.0.0 of their projects), and each
// project the manifests use is stated.
func TestSupportedVersions(t *testing.T) {
	doc := supported(t)
	objs := manifests(t)
	for _, n := range needs {
		var file string
		for _, o := range objs {
			if n.used(o) {
				file = o.file
				break
			}
		}
		if file == "" {
			continue
		}
		stated, ok := doc[n.project]
		if !ok {
			t.Errorf("%s uses %s, but docs/kubernetes.md states no supported %s version", file, n.what, n.project)
			continue
		}
		if minor(t, stated) < minor(t, n.since) {
			t.Errorf("docs/kubernetes.md: %s %s, but %s uses %s, which needs %s", n.project, stated, file, n.what, n.since)
		}
	}
}

// TestReleaseImage: deploy/kustomization.yaml's images: transformer gives
// the kvrouter image a semantic version tag (never latest), the tag the
// router's Deployment names too (so kubectl apply -f of one file runs the
// same release), and docs/kubernetes.md names that version.
// deploy/epp/ is checked when its own kustomization sets a release tag.
func TestReleaseImage(t *testing.T) {
	for _, dir := range []string{".", "epp"} {
		b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var k kustomization
		if err := yaml.UnmarshalStrict(b, &k); err != nil {
			t.Fatal(err)
		}
		tag := ""
		for _, im := range k.Images {
			if im.Name == "kvrouter" {
				tag = im.NewTag
			}
		}
		if !semver.MatchString(tag) {
			t.Errorf("deploy/%s/kustomization.yaml: kvrouter image tag %q, want a release version (vX.Y.Z)", dir, tag)
			continue
		}
		for _, o := range manifests(t) {
			d, ok := o.v.(*appsv1.Deployment)
			if !ok || filepath.Dir(o.file) != dir {
				continue
			}
			for _, c := range d.Spec.Template.Spec.Containers {
				if name, ctag, _ := strings.Cut(c.Image, ":"); name == "kvrouter" && ctag != tag {
					t.Errorf("%s: container %s image %s, want kvrouter:%s (the kustomization's tag)", o.file, c.Name, c.Image, tag)
				}
			}
		}
		doc, err := os.ReadFile(filepath.Join("..", "docs", "kubernetes.md"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), "newTag: "+tag) {
			t.Errorf("docs/kubernetes.md does not name the manifests' release (newTag: %s)", tag)
		}
	}
}
