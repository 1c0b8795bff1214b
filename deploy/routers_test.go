package deploy

import (
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// router returns the router's Deployment (args "serve").
func router(t *testing.T, s *set) *appsv1.Deployment {
	t.Helper()
	for _, d := range s.deployments {
		if c := d.Spec.Template.Spec.Containers; len(c) > 0 && len(c[0].Args) > 0 && c[0].Args[0] == "serve" {
			return d
		}
	}
	t.Fatal("no Deployment runs kvrouter serve")
	return nil
}

// TestSeveralRouters: the router's Deployment runs two or more routers
// spread over nodes (pod anti-affinity on its own pods' labels, per
// host), the PodDisruptionBudget lets one go and keeps one serving, and
// the routers share state: the ConfigMap's redis URL names a Service of
// the manifests on that port whose target is a container port of the pods
// it selects.
func TestSeveralRouters(t *testing.T) {
	s := load(t)
	d := router(t, s)
	n := int32(1)
	if d.Spec.Replicas != nil {
		n = *d.Spec.Replicas
	}
	if n < 2 {
		t.Errorf("Deployment %s: %d replicas, want 2 or more", d.Name, n)
	}
	spread := false
	if a := d.Spec.Template.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
		for _, w := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			term := w.PodAffinityTerm
			if term.TopologyKey == "kubernetes.io/hostname" && term.LabelSelector != nil && selects(term.LabelSelector.MatchLabels, d.Spec.Template.Labels) {
				spread = true
			}
		}
	}
	if !spread {
		t.Errorf("Deployment %s: no pod anti-affinity on its own pods per host", d.Name)
	}
	for _, p := range s.pdbs {
		if !selects(p.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
			continue
		}
		if p.Spec.MinAvailable == nil {
			t.Errorf("PodDisruptionBudget %s: want minAvailable (a count), got %+v", p.Name, p.Spec)
			continue
		}
		m, err := intstr.GetScaledValueFromIntOrPercent(p.Spec.MinAvailable, int(n), true)
		if err != nil || m < 1 || m >= int(n) {
			t.Errorf("PodDisruptionBudget %s: minAvailable %s of %d routers: want at least 1 serving and one allowed to go", p.Name, p.Spec.MinAvailable.String(), n)
		}
	}
	cm := s.configMaps["kvrouter-config"]
	if cm == nil {
		t.Fatal("no ConfigMap kvrouter-config")
	}
	var cfg struct {
		Redis string `json:"redis"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(cfg.Redis)
	if err != nil || u.Scheme != "redis" || u.Port() == "" {
		t.Fatalf("ConfigMap redis: %q, want redis://SERVICE:PORT", cfg.Redis)
	}
	checkServiceRef(t, s, "ConfigMap redis: "+cfg.Redis, u.Hostname(), u.Port())
}

// checkServiceRef fails unless Service host (a name of the manifests) has
// port, targeting a container port of the one Deployment it selects.
func checkServiceRef(t *testing.T, s *set, what, host, port string) {
	t.Helper()
	svc := s.services[strings.Split(host, ".")[0]]
	if svc == nil {
		t.Errorf("%s: no Service %q among the manifests", what, host)
		return
	}
	ds := s.selected(svc.Spec.Selector)
	for _, p := range svc.Spec.Ports {
		if strconv.Itoa(int(p.Port)) != port {
			continue
		}
		if len(ds) == 1 {
			if _, ok := containerPort(&ds[0].Spec.Template.Spec.Containers[0], p.TargetPort); ok {
				return
			}
		}
		t.Errorf("%s: Service %s port %s targets no container port of one Deployment", what, svc.Name, port)
		return
	}
	t.Errorf("%s: Service %s has no port %s", what, svc.Name, port)
}

// TestConfigMapEndpoints: every tcp:// or redis:// endpoint the router's
// ConfigMap names, comments included (the precise-mode hint once named a
// kvrouter-kv Service no manifest defined), is a wildcard, an address, or
// a Service of the manifests with that port.
func TestConfigMapEndpoints(t *testing.T) {
	s := load(t)
	data := s.configMaps["kvrouter-config"].Data["config.yaml"]
	re := regexp.MustCompile(`(?:tcp|redis)://([A-Za-z0-9.*-]+):(\d+)`)
	for _, m := range re.FindAllStringSubmatch(data, -1) {
		host, port := m[1], m[2]
		if host == "*" || net.ParseIP(host) != nil || strings.ToUpper(host) == host {
			continue // a wildcard, an address, or a placeholder (ENGINE)
		}
		checkServiceRef(t, s, "ConfigMap "+m[0], host, port)
	}
}
