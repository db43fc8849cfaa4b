//go:build tools

// Package tools pins the Kubernetes commands the test bed builds with
// `go build k8s.io/kubernetes/cmd/<name>` in this directory.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
