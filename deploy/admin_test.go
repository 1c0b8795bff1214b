package deploy

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvrouter/kvrouter/proxy"
)

// rendered returns the objects `kubectl apply -k dir` creates: kubectl
// kustomize's output when kubectl is here, else the kustomization's
// resources as they are (the transformers it applies, labels and image
// tags, do not touch what the tests below read).
func rendered(t *testing.T, dir string) []object {
	t.Helper()
	if kubectl, err := exec.LookPath("kubectl"); err == nil {
		out, err := exec.Command(kubectl, "kustomize", dir).Output()
		if err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		objs, err := decode("kubectl kustomize "+dir, out)
		if err != nil {
			t.Fatal(err)
		}
		return objs
	}
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ks, err := decode(dir, data)
	if err != nil {
		t.Fatal(err)
	}
	var out []object
	for _, r := range ks[0].v.(*kustomization).Resources {
		data, err := os.ReadFile(filepath.Join(dir, r))
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decode(filepath.Join(dir, r), data)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, objs...)
	}
	return out
}

// adminOf is the admin surface's address and key file of a router
// container (serve or epp): its --config file (a key of a ConfigMap of
// objs mounted in pod), then its KVROUTER_* variables, then its flags.
func adminOf(t *testing.T, objs []object, pod *corev1.PodSpec, c *corev1.Container) (listen, keys string) {
	t.Helper()
	cfg := proxy.DefaultConfig()
	if path := flag(c.Args, "config"); path != "" {
		if err := proxy.DecodeConfig(path, []byte(mountedConfig(t, objs, pod, c, path)), &cfg); err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
	}
	listen, keys = cfg.AdminListen, cfg.AdminAPIKeys
	for _, e := range c.Env {
		switch e.Name {
		case "KVROUTER_ADMIN_LISTEN":
			listen = e.Value
		case "KVROUTER_ADMIN_API_KEYS":
			keys = e.Value
		}
	}
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--admin-listen="); ok {
			listen = v
		}
		if v, ok := strings.CutPrefix(a, "--admin-api-keys="); ok {
			keys = v
		}
	}
	return listen, keys
}

// mountedConfig is the text of the file path in the ConfigMap of objs
// that c mounts there.
func mountedConfig(t *testing.T, objs []object, pod *corev1.PodSpec, c *corev1.Container, path string) string {
	t.Helper()
	for _, m := range c.VolumeMounts {
		rel, err := filepath.Rel(m.MountPath, path)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			for _, o := range objs {
				if cm, ok := o.v.(*corev1.ConfigMap); ok && cm.Name == v.ConfigMap.Name {
					return cm.Data[rel]
				}
			}
		}
	}
	t.Fatalf("%s: --config %s is in no ConfigMap of the rendered manifests", c.Name, path)
	return ""
}

// TestAdminSurfaceClosed: in the manifests as kubectl apply -k applies
// them (deploy/ and deploy/epp/), every router's admin surface (the admin
// API that adds, drains and removes backends and starts recordings;
// /metrics, /ui) listens inside its pod only or asks for a key, and no
// Service exposes a port that listens inside the pod only.
func TestAdminSurfaceClosed(t *testing.T) {
	for _, dir := range []string{".", "epp"} {
		objs := rendered(t, dir)
		routers := 0
		for _, o := range objs {
			d, ok := o.v.(*appsv1.Deployment)
			if !ok {
				continue
			}
			pod := &d.Spec.Template.Spec
			for i := range pod.Containers {
				c := &pod.Containers[i]
				if len(c.Args) == 0 || (c.Args[0] != "serve" && c.Args[0] != "epp") {
					continue
				}
				routers++
				listen, keys := adminOf(t, objs, pod, c)
				if listen == "" {
					continue // no admin surface
				}
				host, port, err := net.SplitHostPort(listen)
				if err != nil {
					t.Fatalf("%s %s: admin-listen %q: %v", dir, d.Name, listen, err)
				}
				ip := net.ParseIP(host)
				inside := host == "localhost" || ip != nil && ip.IsLoopback()
				if !inside && keys == "" {
					t.Errorf("%s: Deployment %s: the admin surface listens on %s, beyond the pod, without admin-api-keys", dir, d.Name, listen)
				}
				if inside {
					checkNotExposed(t, objs, d, c, port)
				}
			}
		}
		if routers == 0 {
			t.Errorf("%s: no router (serve or epp) among the rendered manifests", dir)
		}
	}
}

// checkNotExposed fails when a Service of objs selecting d's pods
// targets c's port port (by number or by the name of that container
// port): a loopback listener no Service reaches.
func checkNotExposed(t *testing.T, objs []object, d *appsv1.Deployment, c *corev1.Container, port string) {
	t.Helper()
	for _, o := range objs {
		svc, ok := o.v.(*corev1.Service)
		if !ok || !selects(svc.Spec.Selector, d.Spec.Template.Labels) {
			continue
		}
		for _, p := range svc.Spec.Ports {
			cp, ok := containerPort(c, p.TargetPort)
			if ok && port == strconv.Itoa(int(cp.ContainerPort)) {
				t.Errorf("Service %s port %s targets %s's admin port %s, which listens inside the pod only", svc.Name, p.Name, d.Name, port)
			}
		}
	}
}
