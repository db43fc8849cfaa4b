// Command etcd is a thin wrapper so the test bed can build a current etcd
// server from the Go module proxy (Debian's etcd is too old for Kubernetes).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
