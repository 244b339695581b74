// Command isthmus-k8s is one multi-call binary holding a whole Kubernetes test
// control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
// kubectl and kwok (fake nodes and pods). It links once instead of six times.
//
// Call it as `isthmus-k8s <component> [flags...]`, or through a symlink named
// after the component (e.g. `kubectl get nodes`).
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var components = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok"}

func run(name string, args []string) int {
	// Cobra-based commands read os.Args[1:]; make them see only their own flags.
	os.Args = append([]string{name}, args...)
	switch name {
	case "etcd":
		etcdmain.Main(os.Args)
		return 0
	case "kube-apiserver":
		return cli.Run(apiserver.NewAPIServerCommand())
	case "kube-controller-manager":
		return cli.Run(controllermanager.NewControllerManagerCommand())
	case "kube-scheduler":
		return cli.Run(scheduler.NewSchedulerCommand())
	case "kubectl":
		logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) //nolint:errcheck
		if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err) // prints and exits non-zero
		}
		return 0
	case "kwok":
		return runKwok()
	}
	fmt.Fprintf(os.Stderr, "unknown component %q; one of: %s\n", name, strings.Join(components, ", "))
	return 2
}

func main() {
	base := filepath.Base(os.Args[0])
	for _, c := range components {
		if base == c {
			os.Exit(run(c, os.Args[1:]))
		}
	}
	if len(os.Args) < 2 {
		fmt.Fprintf(os.Stderr, "usage: %s <%s> [flags...]\n", base, strings.Join(components, "|"))
		os.Exit(2)
	}
	os.Exit(run(os.Args[1], os.Args[2:]))
}
