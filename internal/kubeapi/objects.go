package kubeapi

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodsPath is the pods collection of namespace ns.
func PodsPath(ns string) string { return "/api/v1/namespaces/" + ns + "/pods" }

// PoolsPath is the InferencePool collection (GIE v1) of namespace ns.
func PoolsPath(ns string) string {
	return "/apis/inference.networking.k8s.io/v1/namespaces/" + ns + "/inferencepools"
}

// LeasesPath is the Lease collection of namespace ns.
func LeasesPath(ns string) string { return "/apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases" }

// Pod is a running pod with labels, IP and readiness, as kube-apiserver
// serves one (k8s.io/api's own type).
func Pod(name, ip string, ready bool, labels map[string]string) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

// Pool is a GIE v1 InferencePool as its CRD's JSON has it: a selector's
// matchLabels and target ports.
func Pool(name string, labels map[string]string, ports ...int) map[string]any {
	tps := []any{}
	for _, p := range ports {
		tps = append(tps, map[string]any{"number": p})
	}
	return map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": labels},
			"targetPorts":       tps,
			"endpointPickerRef": map[string]any{"name": "kvrouter-epp", "port": map[string]any{"number": 9002}},
		},
	}
}
