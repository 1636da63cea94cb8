package main

import (
	"flag"
	"os"

	"github.com/spf13/pflag"
	"sigs.k8s.io/kwok/pkg/config"
	"sigs.k8s.io/kwok/pkg/kwok/cmd"
	"sigs.k8s.io/kwok/pkg/log"
	"sigs.k8s.io/kwok/pkg/utils/signals"
)

// runKwok is kwok's own main (cmd/kwok/main.go at the pinned version), reading args, not os.Args.
func runKwok(args []string) int {
	// Kubernetes' packages register global flags at init (verflag's --version among them), which
	// kwok's command would inherit and trip on; kwok's own binary has none of them.
	pflag.CommandLine = pflag.NewFlagSet("kwok", pflag.ExitOnError)
	flag.CommandLine = flag.NewFlagSet("kwok", flag.ExitOnError)
	flagset := pflag.NewFlagSet("global", pflag.ContinueOnError)
	flagset.ParseErrorsAllowlist.UnknownFlags = true
	flagset.Usage = func() {}
	ctx := signals.SetupSignalContext()
	ctx, logger := log.InitFlags(ctx, flagset)
	os.Args = append([]string{"kwok"}, args...)
	ctx, err := config.InitFlags(ctx, flagset)
	if err != nil {
		_, _ = os.Stderr.Write([]byte(flagset.FlagUsages()))
		logger.Error("Init config flags", "err", err)
		return 1
	}
	command := cmd.NewCommand(ctx)
	command.PersistentFlags().AddFlagSet(flagset)
	command.SetArgs(args)
	if err := command.ExecuteContext(ctx); err != nil {
		logger.Error("Execute exit", "err", err)
		return 1
	}
	return 0
}
