package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

// runEtcd starts a single-member etcd on loopback; the API server is its only client.
func runEtcd(args []string) int {
	flags := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := flags.String("data-dir", "", "where etcd keeps its data")
	clientURL := flags.String("listen-client-url", "http://127.0.0.1:2379", "")
	peerURL := flags.String("listen-peer-url", "http://127.0.0.1:2380", "")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	client, err := url.Parse(*clientURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 2
	}
	peer, err := url.Parse(*peerURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.LogLevel = "warn"
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// A test cluster's data is thrown away; skipping fsync saves most of etcd's disk time.
	cfg.UnsafeNoFsync = true
	server, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 1
	}
	defer server.Close()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-server.Server.ReadyNotify():
		fmt.Fprintln(os.Stderr, "etcd: ready on", client)
	case err := <-server.Err():
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 1
	}
	select {
	case err := <-server.Err():
		fmt.Fprintln(os.Stderr, "etcd:", err)
		return 1
	case <-stop:
		return 0
	}
}
