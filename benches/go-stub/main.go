// go-stub: the peer nri-qos is benchmarked against (benches/nri_roundtrip.rs).
// A minimal NRI plugin on containerd/nri's own stub (pkg/stub, v0.8.0 as
// Debian ships it) whose CreateContainer returns an adjustment of the same
// shape as nri-qos's: cpu shares/quota, memory limit, unified keys and
// oom_score_adj, derived from the request. Its Synchronize only records the
// container ids, so its sync time is the stub's decoding and nothing else.
// Build: benches/go-stub/build.sh (offline, Debian's Go and -dev packages).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type plugin struct {
	known map[string]struct{}
}

func (p *plugin) Synchronize(_ context.Context, _ []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	for _, c := range ctrs {
		p.known[c.Id] = struct{}{}
	}
	return nil, nil
}

func (p *plugin) CreateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adj := &api.ContainerAdjustment{}
	res := c.GetLinux().GetResources()
	var shares uint64 = 2
	var quota int64 = -1
	var limit int64
	if cpu := res.GetCpu(); cpu != nil {
		if s := cpu.GetShares(); s != nil && s.GetValue() > 0 {
			shares = s.GetValue()
		}
		if q := cpu.GetQuota(); q != nil {
			quota = q.GetValue()
		}
	}
	if m := res.GetMemory().GetLimit(); m != nil {
		limit = m.GetValue()
	}
	adj.SetLinuxCPUShares(shares)
	adj.SetLinuxCPUQuota(quota)
	if limit > 0 {
		adj.SetLinuxMemoryLimit(limit)
		// memory.high at 90 % of the limit, memory.low at a quarter of it.
		adj.AddLinuxUnified("memory.high", strconv.FormatInt(limit/10*9, 10))
		adj.AddLinuxUnified("memory.low", strconv.FormatInt(limit/4, 10))
	}
	adj.AddLinuxUnified("cpu.weight", strconv.FormatUint(1+((shares-2)*9999)/262142, 10))
	oom := 500
	if o := c.GetLinux().GetOomScoreAdj(); o != nil {
		oom = int(o.GetValue())
	}
	adj.SetLinuxOomScoreAdj(&oom)
	p.known[c.Id] = struct{}{}
	return adj, nil, nil
}

func main() {
	socket := flag.String("socket", "/var/run/nri/nri.sock", "NRI socket to dial")
	flag.Parse()
	p := &plugin{known: map[string]struct{}{}}
	s, err := stub.New(p,
		stub.WithPluginName("go-stub"),
		stub.WithPluginIdx("90"),
		stub.WithSocketPath(*socket),
		stub.WithOnClose(func() { os.Exit(0) }))
	if err != nil {
		fmt.Fprintln(os.Stderr, "go-stub:", err)
		os.Exit(1)
	}
	if err := s.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "go-stub:", err)
		os.Exit(1)
	}
}
