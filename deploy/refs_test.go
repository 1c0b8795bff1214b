package deploy

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kvrouter/kvrouter/proxy"
)

// set is the manifests by kind and name.
type set struct {
	deployments map[string]*appsv1.Deployment
	services    map[string]*corev1.Service
	configMaps  map[string]*corev1.ConfigMap
	hpas        []*autoscalingv2.HorizontalPodAutoscaler
	pdbs        []*policyv1.PodDisruptionBudget
	monitors    []*serviceMonitor
	pools       map[string]*inferencePool
	routes      []*httpRoute
}

func load(t *testing.T) *set {
	t.Helper()
	s := &set{deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{},
		configMaps: map[string]*corev1.ConfigMap{}, pools: map[string]*inferencePool{}}
	for _, o := range manifests(t) {
		switch v := o.v.(type) {
		case *appsv1.Deployment:
			s.deployments[v.Name] = v
		case *corev1.Service:
			s.services[v.Name] = v
		case *corev1.ConfigMap:
			s.configMaps[v.Name] = v
		case *autoscalingv2.HorizontalPodAutoscaler:
			s.hpas = append(s.hpas, v)
		case *policyv1.PodDisruptionBudget:
			s.pdbs = append(s.pdbs, v)
		case *serviceMonitor:
			s.monitors = append(s.monitors, v)
		case *inferencePool:
			s.pools[v.Metadata.Name] = v
		case *httpRoute:
			s.routes = append(s.routes, v)
		}
	}
	return s
}

// selects reports whether selector (non-empty) is a subset of labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// selected returns the Deployments whose pods selector picks.
func (s *set) selected(selector map[string]string) []*appsv1.Deployment {
	var out []*appsv1.Deployment
	for _, d := range s.deployments {
		if selects(selector, d.Spec.Template.Labels) {
			out = append(out, d)
		}
	}
	return out
}

// containerPort finds port (a name or a number) among c's ports.
func containerPort(c *corev1.Container, port intstr.IntOrString) (corev1.ContainerPort, bool) {
	for _, p := range c.Ports {
		if port.Type == intstr.String && p.Name == port.StrVal || port.Type == intstr.Int && p.ContainerPort == port.IntVal {
			return p, true
		}
	}
	return corev1.ContainerPort{}, false
}

// flag returns the value of --name=value in args, or "".
func flag(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// TestDeployments: each Deployment's selector picks its own pods, its
// containers run as non-root on a read-only root, have readiness and
// liveness probes on separate endpoints whose ports are container ports,
// and the ConfigMaps they mount exist with the keys they read.
func TestDeployments(t *testing.T) {
	s := load(t)
	uid := dockerUID(t)
	for name, d := range s.deployments {
		t.Run(name, func(t *testing.T) {
			if !selects(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
				t.Errorf("selector %v does not match the pod labels %v", d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
			}
			pod := &d.Spec.Template.Spec
			if sc := pod.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != uid {
				t.Errorf("pod security context %+v: want runAsNonRoot and runAsUser %d (the image's USER)", sc, uid)
			}
			for i := range pod.Containers {
				c := &pod.Containers[i]
				checkContainer(t, s, pod, c)
			}
		})
	}
}

func checkContainer(t *testing.T, s *set, pod *corev1.PodSpec, c *corev1.Container) {
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("%s: security context %+v: want a read-only root, no privilege escalation, capabilities dropped", c.Name, sc)
	}
	if c.ReadinessProbe == nil || c.LivenessProbe == nil {
		t.Fatalf("%s: readiness %v, liveness %v: want both", c.Name, c.ReadinessProbe, c.LivenessProbe)
	}
	if endpoint(t, c, c.ReadinessProbe) == endpoint(t, c, c.LivenessProbe) {
		t.Errorf("%s: readiness and liveness probe the same endpoint %s", c.Name, endpoint(t, c, c.ReadinessProbe))
	}
	if c.StartupProbe != nil {
		endpoint(t, c, c.StartupProbe)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s: resources %+v: want a CPU request and a memory limit", c.Name, c.Resources)
	}
	if path := flag(c.Args, "config"); path != "" {
		checkConfig(t, s, pod, c, path)
	}
	if l := flag(c.Args, "listen"); l != "" {
		checkPort(t, c, "--listen", l, "grpc")
	}
	if d := flag(c.Args, "discover"); d != "" {
		checkDiscover(t, s, d)
	}
}

// endpoint checks a probe's port is a container port and returns what it
// probes.
func endpoint(t *testing.T, c *corev1.Container, p *corev1.Probe) string {
	t.Helper()
	switch {
	case p.HTTPGet != nil:
		port, ok := containerPort(c, p.HTTPGet.Port)
		if !ok {
			t.Errorf("%s: probe port %s is no container port", c.Name, p.HTTPGet.Port.String())
		}
		return "http " + strconv.Itoa(int(port.ContainerPort)) + p.HTTPGet.Path
	case p.GRPC != nil:
		if _, ok := containerPort(c, intstr.FromInt32(p.GRPC.Port)); !ok {
			t.Errorf("%s: gRPC probe port %d is no container port", c.Name, p.GRPC.Port)
		}
		svc := ""
		if p.GRPC.Service != nil {
			svc = *p.GRPC.Service
		}
		return "grpc " + strconv.Itoa(int(p.GRPC.Port)) + " " + svc
	case p.TCPSocket != nil:
		port, ok := containerPort(c, p.TCPSocket.Port)
		if !ok {
			t.Errorf("%s: TCP probe port %s is no container port", c.Name, p.TCPSocket.Port.String())
		}
		return "tcp " + strconv.Itoa(int(port.ContainerPort))
	case p.Exec != nil && len(p.Exec.Command) > 0:
		return "exec " + strings.Join(p.Exec.Command, " ")
	}
	t.Errorf("%s: probe %+v is neither HTTP, gRPC, TCP nor a command", c.Name, p)
	return ""
}

// checkPort checks that addr (host:port, a router listen address) is the
// container port named name.
func checkPort(t *testing.T, c *corev1.Container, what, addr, name string) {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: %s %q: %v", c.Name, what, addr, err)
		return
	}
	p, ok := containerPort(c, intstr.FromString(name))
	if !ok || strconv.Itoa(int(p.ContainerPort)) != port {
		t.Errorf("%s: %s %s, but the container port %q is %d", c.Name, what, addr, name, p.ContainerPort)
	}
}

// checkConfig checks that the --config file is a key of a mounted
// ConfigMap, and that it is a valid router configuration whose listeners
// are the container's ports.
func checkConfig(t *testing.T, s *set, pod *corev1.PodSpec, c *corev1.Container, path string) {
	t.Helper()
	var cm *corev1.ConfigMap
	for _, m := range c.VolumeMounts {
		rel, err := filepath.Rel(m.MountPath, path)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			if cm = s.configMaps[v.ConfigMap.Name]; cm == nil {
				t.Fatalf("%s: volume %s names ConfigMap %q, which no manifest defines", c.Name, v.Name, v.ConfigMap.Name)
			}
			data, ok := cm.Data[rel]
			if !ok {
				t.Fatalf("%s: --config %s: ConfigMap %s has no key %q", c.Name, path, cm.Name, rel)
			}
			checkRouterConfig(t, s, pod, c, data)
			return
		}
	}
	t.Errorf("%s: --config %s is under no ConfigMap volume mount", c.Name, path)
}

func checkRouterConfig(t *testing.T, s *set, pod *corev1.PodSpec, c *corev1.Container, data string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(f, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := proxy.DefaultConfig()
	if err := proxy.ReadConfigFile(f, &cfg); err != nil {
		t.Fatalf("%s: the ConfigMap's router configuration: %v", c.Name, err)
	}
	checkPort(t, c, "listen", cfg.Listen, "http")
	checkPort(t, c, "admin-listen", cfg.AdminListen, "admin")
	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	var pause time.Duration
	if l := c.Lifecycle; l != nil && l.PreStop != nil && l.PreStop.Sleep != nil {
		pause = time.Duration(l.PreStop.Sleep.Seconds) * time.Second
	}
	if cfg.DrainTimeout+pause >= grace {
		t.Errorf("%s: drain-timeout %s + preStop %s ≥ terminationGracePeriodSeconds %s: the kubelet kills the drain", c.Name, cfg.DrainTimeout, pause, grace)
	}
}

// checkDiscover checks --discover dns://NAME:PORT names a headless Service
// of the manifests with that port.
func checkDiscover(t *testing.T, s *set, d string) {
	t.Helper()
	hostport, ok := strings.CutPrefix(d, "dns://")
	host, port, err := net.SplitHostPort(hostport)
	if !ok || err != nil {
		t.Fatalf("--discover %q: want dns://NAME:PORT", d)
	}
	svc := s.services[strings.Split(host, ".")[0]]
	if svc == nil || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Fatalf("--discover %s: no headless Service %q among the manifests", d, host)
	}
	for _, p := range svc.Spec.Ports {
		if strconv.Itoa(int(p.Port)) == port {
			return
		}
	}
	t.Errorf("--discover %s: Service %s has no port %s", d, svc.Name, port)
}

// TestServices: each Service but the engines' headless one selects the
// pods of one Deployment, and its target ports are their container ports.
func TestServices(t *testing.T) {
	s := load(t)
	for name, svc := range s.services {
		if svc.Spec.ClusterIP == corev1.ClusterIPNone {
			continue // the engines' pods are not ours: see TestInferencePool
		}
		ds := s.selected(svc.Spec.Selector)
		if len(ds) != 1 {
			t.Errorf("Service %s selects the pods of %d Deployments, want 1", name, len(ds))
			continue
		}
		c := &ds[0].Spec.Template.Spec.Containers[0]
		for _, p := range svc.Spec.Ports {
			if _, ok := containerPort(c, p.TargetPort); !ok {
				t.Errorf("Service %s port %s: target %s is no port of %s", name, p.Name, p.TargetPort.String(), ds[0].Name)
			}
		}
	}
}

// TestScaling: the HPA and the PodDisruptionBudget name the router's
// Deployment.
func TestScaling(t *testing.T) {
	s := load(t)
	for _, h := range s.hpas {
		ref := h.Spec.ScaleTargetRef
		if d := s.deployments[ref.Name]; d == nil || ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" {
			t.Errorf("HPA %s scales %s %s %q: no such Deployment", h.Name, ref.APIVersion, ref.Kind, ref.Name)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas > h.Spec.MaxReplicas {
			t.Errorf("HPA %s: min %v max %d", h.Name, h.Spec.MinReplicas, h.Spec.MaxReplicas)
		}
	}
	for _, p := range s.pdbs {
		if len(s.selected(p.Spec.Selector.MatchLabels)) != 1 {
			t.Errorf("PodDisruptionBudget %s selects %d Deployments, want 1", p.Name, len(s.selected(p.Spec.Selector.MatchLabels)))
		}
	}
}

// TestServiceMonitor: the ServiceMonitor selects the router's Services
// and scrapes a port each of them has, at /metrics.
func TestServiceMonitor(t *testing.T) {
	s := load(t)
	if len(s.monitors) == 0 {
		t.Fatal("no ServiceMonitor")
	}
	for _, m := range s.monitors {
		var picked []*corev1.Service
		for _, svc := range s.services {
			if selects(m.Spec.Selector.MatchLabels, svc.Labels) {
				picked = append(picked, svc)
			}
		}
		if len(picked) == 0 {
			t.Errorf("ServiceMonitor %s selects no Service", m.Metadata.Name)
		}
		for _, e := range m.Spec.Endpoints {
			if e.Path != "/metrics" {
				t.Errorf("ServiceMonitor %s scrapes %q, want /metrics", m.Metadata.Name, e.Path)
			}
			iv, err1 := time.ParseDuration(e.Interval)
			to, err2 := time.ParseDuration(e.ScrapeTimeout)
			if err1 != nil || err2 != nil || to > iv {
				t.Errorf("ServiceMonitor %s: interval %q, timeout %q: want durations, timeout ≤ interval", m.Metadata.Name, e.Interval, e.ScrapeTimeout)
			}
			for _, svc := range picked {
				found := false
				for _, p := range svc.Spec.Ports {
					found = found || p.Name == e.Port
				}
				if !found {
					t.Errorf("ServiceMonitor %s scrapes port %q, which Service %s has not", m.Metadata.Name, e.Port, svc.Name)
				}
			}
		}
	}
}

// TestInferencePool: the pool's pods are those of the engines' headless
// Service (the picker's --discover), on its port; its endpoint picker is
// a Service of the manifests serving the picker's gRPC port; the sample
// HTTPRoute sends to the pool.
func TestInferencePool(t *testing.T) {
	s := load(t)
	if len(s.pools) == 0 {
		t.Fatal("no InferencePool")
	}
	for name, p := range s.pools {
		var engines *corev1.Service
		for _, svc := range s.services {
			if svc.Spec.ClusterIP == corev1.ClusterIPNone && selects(p.Spec.Selector.MatchLabels, svc.Spec.Selector) && selects(svc.Spec.Selector, p.Spec.Selector.MatchLabels) {
				engines = svc
			}
		}
		if engines == nil {
			t.Fatalf("InferencePool %s: no headless Service selects its pods %v", name, p.Spec.Selector.MatchLabels)
		}
		if len(p.Spec.TargetPorts) != 1 || p.Spec.TargetPorts[0].Number != engines.Spec.Ports[0].Port {
			t.Errorf("InferencePool %s target ports %+v, want the engines' port %d", name, p.Spec.TargetPorts, engines.Spec.Ports[0].Port)
		}
		ref := p.Spec.EndpointPickerRef
		epp := s.services[ref.Name]
		if epp == nil || ref.Port == nil {
			t.Fatalf("InferencePool %s: endpoint picker %q port %v: no such Service", name, ref.Name, ref.Port)
		}
		ok := false
		for _, sp := range epp.Spec.Ports {
			ok = ok || sp.Port == ref.Port.Number && sp.Name == "grpc"
		}
		if !ok {
			t.Errorf("InferencePool %s: Service %s has no grpc port %d", name, epp.Name, ref.Port.Number)
		}
		if ref.FailureMode != "" && ref.FailureMode != "FailClose" && ref.FailureMode != "FailOpen" {
			t.Errorf("InferencePool %s: failureMode %q", name, ref.FailureMode)
		}
	}
	for _, r := range s.routes {
		for _, rule := range r.Spec.Rules {
			for _, b := range rule.BackendRefs {
				if b.Kind != "InferencePool" || b.Group != "inference.networking.k8s.io" || s.pools[b.Name] == nil {
					t.Errorf("HTTPRoute %s sends to %s %s %q: no such InferencePool", r.Metadata.Name, b.Group, b.Kind, b.Name)
				}
			}
		}
	}
}
