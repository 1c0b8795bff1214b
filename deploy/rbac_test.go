package deploy

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// grants reports whether role allows verb on resource of group.
func grants(role *rbacv1.Role, group, resource, verb string) bool {
	for _, r := range role.Rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

// TestRBAC: every Deployment whose kvrouter reads the Kubernetes API
// (--pool-name, --leader-elect, --discover k8s:// or inferencepool://)
// mounts its service account's token, and a RoleBinding gives that
// account a Role with the verbs the code uses: list and watch of pods and
// InferencePools (package kube's Follow; with --pool-name the pool's
// InferenceObjectives too), get, create and update of
// Leases (kube.Election). The router's own Role covers its k8s://
// discovery.
func TestRBAC(t *testing.T) {
	roles := map[string]*rbacv1.Role{}
	var bindings []*rbacv1.RoleBinding
	var deployments []*appsv1.Deployment
	for _, o := range manifests(t) {
		switch v := o.v.(type) {
		case *rbacv1.Role:
			roles[v.Name] = v
		case *rbacv1.RoleBinding:
			bindings = append(bindings, v)
		case *appsv1.Deployment:
			deployments = append(deployments, v)
		}
	}
	rolesOf := func(sa string) []*rbacv1.Role {
		var out []*rbacv1.Role
		for _, b := range bindings {
			for _, s := range b.Subjects {
				if s.Kind == "ServiceAccount" && s.Name == sa && b.RoleRef.Kind == "Role" && roles[b.RoleRef.Name] != nil {
					out = append(out, roles[b.RoleRef.Name])
				}
			}
		}
		return out
	}
	allowed := func(sa, group, resource, verb string) bool {
		return slices.ContainsFunc(rolesOf(sa), func(r *rbacv1.Role) bool { return grants(r, group, resource, verb) })
	}
	for _, verb := range []string{"list", "watch"} {
		for _, res := range [][2]string{{"", "pods"}, {"inference.networking.k8s.io", "inferencepools"}} {
			if !allowed("kvrouter", res[0], res[1], verb) {
				t.Errorf("service account kvrouter may not %s %s: k8s:// and inferencepool:// discovery need it", verb, res[1])
			}
		}
	}
	checked := 0
	for _, d := range deployments {
		pod := d.Spec.Template.Spec
		for _, c := range pod.Containers {
			disc := flag(c.Args, "discover")
			pool := flag(c.Args, "pool-name") != "" || strings.HasPrefix(disc, "inferencepool://")
			pods := pool || strings.HasPrefix(disc, "k8s://")
			elect := slices.Contains(c.Args, "--leader-elect")
			if !pods && !elect {
				continue
			}
			checked++
			sa := pod.ServiceAccountName
			if pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
				t.Errorf("%s: reads the Kubernetes API but does not mount its service account token", d.Name)
			}
			need := map[[2]string][]string{}
			if pods {
				need[[2]string{"", "pods"}] = []string{"list", "watch"}
			}
			if pool {
				need[[2]string{"inference.networking.k8s.io", "inferencepools"}] = []string{"list", "watch"}
			}
			if flag(c.Args, "pool-name") != "" { // epp follows the pool's objectives
				need[[2]string{"inference.networking.x-k8s.io", "inferenceobjectives"}] = []string{"list", "watch"}
			}
			if elect {
				need[[2]string{"coordination.k8s.io", "leases"}] = []string{"get", "create", "update"}
			}
			for res, verbs := range need {
				for _, v := range verbs {
					if !allowed(sa, res[0], res[1], v) {
						t.Errorf("%s: service account %q may not %s %s", d.Name, sa, v, res[1])
					}
				}
			}
			if elect && !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_NAME" && e.ValueFrom != nil }) {
				t.Errorf("%s: --leader-elect without POD_NAME from the pod's name: the lease holder would be a host name", d.Name)
			}
		}
	}
	if checked == 0 {
		t.Error("no Deployment reads the Kubernetes API: the endpoint picker should follow its pool")
	}
}
