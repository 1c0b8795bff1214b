// Command etcd is etcd's server, for the real kube-apiserver that
// kvrouter's Kubernetes tests start.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
