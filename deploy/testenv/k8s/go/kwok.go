package main

import (
	"os"

	"github.com/spf13/pflag"

	"sigs.k8s.io/kwok/pkg/config"
	"sigs.k8s.io/kwok/pkg/kwok/cmd"
	"sigs.k8s.io/kwok/pkg/log"
	"sigs.k8s.io/kwok/pkg/utils/signals"
)

// runKwok mirrors sigs.k8s.io/kwok/cmd/kwok's main.
func runKwok() int {
	// The Kubernetes packages linked into this binary register a non-bool --version flag
	// (component-base/version/verflag) on pflag.CommandLine at init; cobra merges that set
	// into kwok's root command, whose own --version is a bool. kwok needs none of them.
	pflag.CommandLine = pflag.NewFlagSet(os.Args[0], pflag.ExitOnError)

	flagset := pflag.NewFlagSet("global", pflag.ContinueOnError)
	flagset.ParseErrorsAllowlist.UnknownFlags = true
	flagset.Usage = func() {}

	ctx := signals.SetupSignalContext()
	ctx, logger := log.InitFlags(ctx, flagset)

	ctx, err := config.InitFlags(ctx, flagset)
	if err != nil {
		_, _ = os.Stderr.Write([]byte(flagset.FlagUsages()))
		logger.Error("Init config flags", "err", err)
		return 1
	}

	command := cmd.NewCommand(ctx)
	command.PersistentFlags().AddFlagSet(flagset)
	if err := command.ExecuteContext(ctx); err != nil {
		logger.Error("Execute exit", "err", err)
		return 1
	}
	return 0
}
