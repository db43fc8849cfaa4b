//go:build tools

// Package tools pins the Helm command for the test bed; build it with
// `go build helm.sh/helm/v3/cmd/helm` in this directory.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
