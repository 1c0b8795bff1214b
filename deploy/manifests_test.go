package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// The manifests' own types for the kinds k8s.io/api does not have,
// mirroring the fields used here of their published APIs; decoding is as
// strict for them (a field not listed is an error).

// serviceMonitor is monitoring.coreos.com/v1 ServiceMonitor (Prometheus
// Operator).
type serviceMonitor struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		Endpoints []struct {
			Port          string `json:"port,omitempty"`
			Path          string `json:"path,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
			Authorization *struct {
				Type        string                    `json:"type,omitempty"`
				Credentials *corev1.SecretKeySelector `json:"credentials,omitempty"`
			} `json:"authorization,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// inferencePool is inference.networking.k8s.io/v1 InferencePool (Gateway
// API Inference Extension).
type inferencePool struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		TargetPorts []struct {
			Number int32 `json:"number"`
		} `json:"targetPorts"`
		EndpointPickerRef struct {
			Group *string `json:"group,omitempty"`
			Kind  string  `json:"kind,omitempty"`
			Name  string  `json:"name"`
			Port  *struct {
				Number int32 `json:"number"`
			} `json:"port,omitempty"`
			FailureMode string `json:"failureMode,omitempty"`
		} `json:"endpointPickerRef"`
	} `json:"spec"`
}

// httpRoute is gateway.networking.k8s.io/v1 HTTPRoute (Gateway API).
type httpRoute struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		ParentRefs []struct {
			Group       string `json:"group,omitempty"`
			Kind        string `json:"kind,omitempty"`
			Name        string `json:"name"`
			Namespace   string `json:"namespace,omitempty"`
			SectionName string `json:"sectionName,omitempty"`
		} `json:"parentRefs"`
		Rules []struct {
			Matches []struct {
				Path *struct {
					Type  string `json:"type,omitempty"`
					Value string `json:"value,omitempty"`
				} `json:"path,omitempty"`
			} `json:"matches,omitempty"`
			BackendRefs []struct {
				Group  string `json:"group,omitempty"`
				Kind   string `json:"kind,omitempty"`
				Name   string `json:"name"`
				Port   *int32 `json:"port,omitempty"`
				Weight *int32 `json:"weight,omitempty"`
			} `json:"backendRefs,omitempty"`
			Timeouts *struct {
				Request        string `json:"request,omitempty"`
				BackendRequest string `json:"backendRequest,omitempty"`
			} `json:"timeouts,omitempty"`
		} `json:"rules"`
	} `json:"spec"`
}

// prometheusRule is monitoring.coreos.com/v1 PrometheusRule (Prometheus
// Operator); its groups are a Prometheus rules file's.
type prometheusRule struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Groups []ruleGroup `json:"groups"`
	} `json:"spec"`
}

// ruleGroup is one group of a Prometheus rules file.
type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []struct {
		Record      string            `json:"record,omitempty"`
		Alert       string            `json:"alert,omitempty"`
		Expr        string            `json:"expr"`
		For         string            `json:"for,omitempty"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	} `json:"rules"`
}

// kustomization is kustomize.config.k8s.io/v1beta1 Kustomization.
type kustomization struct {
	metav1.TypeMeta `json:",inline"`
	Labels          []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors,omitempty"`
	} `json:"labels,omitempty"`
	Resources []string `json:"resources"`
	Images    []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images,omitempty"`
}

// kinds maps apiVersion/kind to a new value of its type.
var kinds = map[string]func() any{
	"v1/ConfigMap":                                  func() any { return new(corev1.ConfigMap) },
	"v1/Service":                                    func() any { return new(corev1.Service) },
	"v1/ServiceAccount":                             func() any { return new(corev1.ServiceAccount) },
	"apps/v1/Deployment":                            func() any { return new(appsv1.Deployment) },
	"policy/v1/PodDisruptionBudget":                 func() any { return new(policyv1.PodDisruptionBudget) },
	"autoscaling/v2/HorizontalPodAutoscaler":        func() any { return new(autoscalingv2.HorizontalPodAutoscaler) },
	"monitoring.coreos.com/v1/ServiceMonitor":       func() any { return new(serviceMonitor) },
	"monitoring.coreos.com/v1/PrometheusRule":       func() any { return new(prometheusRule) },
	"inference.networking.k8s.io/v1/InferencePool":  func() any { return new(inferencePool) },
	"gateway.networking.k8s.io/v1/HTTPRoute":        func() any { return new(httpRoute) },
	"kustomize.config.k8s.io/v1beta1/Kustomization": func() any { return new(kustomization) },
	"rbac.authorization.k8s.io/v1/Role":             func() any { return new(rbacv1.Role) },
	"rbac.authorization.k8s.io/v1/RoleBinding":      func() any { return new(rbacv1.RoleBinding) },
}

// notManifests are the YAML files under deploy/ that are no Kubernetes
// objects (checked by their own tests), and the folders another part
// owns.
var notManifests = []string{"epp/envoy.yaml"}

// optional are the manifests no kustomization applies, each for a reason
// its header gives.
var optional = []string{"hpa.yaml", "servicemonitor.yaml", "prometheusrule.yaml", "epp/httproute.yaml"}

// object is one decoded manifest.
type object struct {
	file string // relative to deploy/
	kind string // apiVersion/kind
	v    any
}

// decode decodes the YAML documents of data strictly into their types: a
// field the type does not have, a duplicate field or an unknown kind is
// an error.
func decode(file string, data []byte) ([]object, error) {
	var out []object
	for i, doc := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("%s document %d: %w", file, i, err)
		}
		key := tm.APIVersion + "/" + tm.Kind
		mk, ok := kinds[key]
		if !ok {
			return nil, fmt.Errorf("%s document %d: unknown kind %q", file, i, key)
		}
		v := mk()
		if err := strict(doc, v); err != nil {
			return nil, fmt.Errorf("%s document %d (%s): %w", file, i, key, err)
		}
		out = append(out, object{file: file, kind: key, v: v})
	}
	return out, nil
}

// strict decodes the YAML doc into v as the API server's strict field
// validation does: field names match case-sensitively (encoding/json,
// under sigs.k8s.io/yaml's UnmarshalStrict, would take
// readOnlyRootFileSystem for readOnlyRootFilesystem), and an unknown or
// duplicate field is an error.
func strict(doc []byte, v any) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	serrs, err := kjson.UnmarshalStrict(js, v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(serrs...)
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			b.Write(l)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// manifests decodes every manifest under deploy/.
func manifests(t *testing.T) []object {
	t.Helper()
	var out []object
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (path == "grafana" || path == "testdata") {
			return filepath.SkipDir // another part's, or test inputs: not Kubernetes objects
		}
		if d.IsDir() || !strings.HasSuffix(path, ".yaml") || slices.Contains(notManifests, path) {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		objs, err := decode(path, data)
		if err != nil {
			return err
		}
		out = append(out, objs...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no manifests found")
	}
	return out
}

// TestManifestsDecodeStrictly: every manifest decodes into its API type
// with no unknown or duplicate field.
func TestManifestsDecodeStrictly(t *testing.T) {
	seen := map[string]int{}
	for _, o := range manifests(t) {
		seen[o.kind]++
	}
	for _, want := range []string{"apps/v1/Deployment", "v1/Service", "v1/ConfigMap", "autoscaling/v2/HorizontalPodAutoscaler",
		"monitoring.coreos.com/v1/ServiceMonitor", "inference.networking.k8s.io/v1/InferencePool"} {
		if seen[want] == 0 {
			t.Errorf("no %s among the manifests", want)
		}
	}
	t.Logf("decoded: %v", seen)
}

// TestStrictDecodingCatchesMistakes: the decoding the manifests pass
// rejects a misspelt field at any depth, a duplicate field and an unknown
// kind, in the k8s.io/api types and in the local ones.
func TestStrictDecodingCatchesMistakes(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	deploy, sm, pool := read("deployment.yaml"), read("servicemonitor.yaml"), read("epp/inferencepool.yaml")
	cases := []struct{ name, doc, old, new string }{
		{"top-level field", deploy, "  replicas: 2", "  replica: 2"},
		{"probe field", deploy, "readinessProbe:", "readinesProbe:"},
		{"deep field", deploy, "readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true"},
		{"wrong type", deploy, "containerPort: 8000", "containerPort: eight"},
		{"duplicate field", deploy, "  replicas: 2", "  replicas: 2\n  replicas: 3"},
		{"unknown kind", deploy, "kind: Deployment", "kind: Deploymnet"},
		{"service monitor field", sm, "scrapeTimeout:", "scrapeTimout:"},
		{"inference pool field", pool, "failureMode:", "failurMode:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(c.doc, c.old) {
				t.Fatalf("%q not in the manifest: the case tests nothing", c.old)
			}
			if _, err := decode(c.name, []byte(c.doc)); err != nil {
				t.Fatalf("the manifest itself does not decode: %v", err)
			}
			_, err := decode(c.name, []byte(strings.Replace(c.doc, c.old, c.new, 1)))
			if err == nil {
				t.Errorf("%q → %q decoded without error", c.old, c.new)
			} else {
				t.Logf("%v", err)
			}
		})
	}
}

// TestKustomizationsListEveryManifest: each kustomization's resources
// exist, and every manifest is applied by one or is a documented optional
// one.
func TestKustomizationsListEveryManifest(t *testing.T) {
	applied := map[string]bool{}
	var all []string
	for _, o := range manifests(t) {
		k, ok := o.v.(*kustomization)
		if !ok {
			all = append(all, o.file)
			continue
		}
		dir := filepath.Dir(o.file)
		for _, r := range k.Resources {
			p := filepath.Join(dir, r)
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s lists %s: %v", o.file, r, err)
			}
			applied[p] = true
		}
	}
	for _, f := range all {
		if !applied[f] && !slices.Contains(optional, f) {
			t.Errorf("%s is in no kustomization and not listed as optional", f)
		}
		if applied[f] && slices.Contains(optional, f) {
			t.Errorf("%s is listed as optional but a kustomization applies it", f)
		}
	}
}
