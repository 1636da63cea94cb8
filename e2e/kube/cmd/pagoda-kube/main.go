// Command pagoda-kube is the whole test control plane in one binary: its first argument picks
// the program (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, kwok).
// One binary links Kubernetes' shared packages once, which is most of a cold build's time.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	kubectl "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var programs = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubectl":                 kubectl.NewDefaultKubectlCommand,
}

func main() {
	// Called through a link named after a program (kubectl -> pagoda-kube), or as
	// `pagoda-kube PROGRAM ARGS...`.
	name, args := filepath.Base(os.Args[0]), os.Args[1:]
	if name == "pagoda-kube" {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, "usage: pagoda-kube kube-apiserver|kube-controller-manager|kube-scheduler|kubectl|etcd|kwok ARGS...")
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	switch name {
	case "etcd":
		os.Exit(runEtcd(args))
	case "kwok":
		os.Exit(runKwok(args))
	}
	if name == "kube-controller-manager" {
		if err := tuneJobController(); err != nil {
			fmt.Fprintln(os.Stderr, "pagoda-kube:", err)
			os.Exit(2)
		}
	}
	newCommand, ok := programs[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "pagoda-kube: unknown program %q\n", name)
		os.Exit(2)
	}
	command := newCommand()
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}
