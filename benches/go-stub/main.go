// go-stub: the peer nri-qos is benchmarked against (benches/nri_roundtrip.rs).
// A minimal NRI plugin on containerd/nri's own stub (pkg/stub, v0.8.0 as
// Debian ships it) whose CreateContainer returns the adjustment nri-qos
// returns for the bench's requests: unified keys, oom_score_adj and, where
// out of range, cpu shares/quota. Its Synchronize only records the
// container ids, so its sync time is the stub's decoding and nothing else.
// Build: benches/go-stub/build.sh (offline, Debian's Go and -dev packages).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type plugin struct {
	known    map[string]struct{}
	memTotal int64
}

func (p *plugin) Synchronize(_ context.Context, _ []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	for _, c := range ctrs {
		p.known[c.Id] = struct{}{}
	}
	return nil, nil
}

// CreateContainer answers with what nri-qos answers for the same request on a
// cgroup v2 node: class from the pod's cgroup parent, cpu.weight from the
// shares (clamped like the kernel's range), memory.min (Guaranteed) or
// memory.low (Burstable, request recovered from the kubelet's oom_score_adj),
// memory.high (Burstable, BestEffort) and oom_score_adj by class.
func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adj := &api.ContainerAdjustment{}
	res := c.GetLinux().GetResources()
	parent := pod.GetLinux().GetCgroupParent()
	var shares uint64 = 2
	if s := res.GetCpu().GetShares(); s != nil {
		shares = s.GetValue()
	}
	if shares < 2 || shares > 262144 {
		shares = min(max(shares, 2), 262144)
		adj.SetLinuxCPUShares(shares)
	}
	if q := res.GetCpu().GetQuota(); q != nil && q.GetValue() > 0 && q.GetValue() < 1000 {
		adj.SetLinuxCPUQuota(1000)
	}
	adj.AddLinuxUnified("cpu.weight", strconv.FormatUint(1+((shares-2)*9999)/262142, 10))
	var limit int64
	if m := res.GetMemory().GetLimit(); m != nil {
		limit = m.GetValue()
	}
	oom := int(500)
	if o := c.GetLinux().GetOomScoreAdj(); o != nil {
		oom = int(o.GetValue())
	}
	switch {
	case strings.Contains(parent, "besteffort"):
		high := p.memTotal / 10 * 9
		if limit > 0 {
			high = limit / 10 * 9
		}
		adj.AddLinuxUnified("memory.high", strconv.FormatInt(high/4096*4096, 10))
		if oom != 1000 {
			oom = 1000
			adj.SetLinuxOomScoreAdj(&oom)
		}
	case strings.Contains(parent, "burstable"):
		request := p.memTotal / 1000 * int64(1000-oom)
		if limit > 0 && request > limit {
			request = limit
		}
		adj.AddLinuxUnified("memory.low", strconv.FormatInt(request, 10))
		if limit > request {
			adj.AddLinuxUnified("memory.high", strconv.FormatInt((request+(limit-request)/10*9)/4096*4096, 10))
		}
	default:
		if limit > 0 {
			adj.AddLinuxUnified("memory.min", strconv.FormatInt(limit, 10))
		}
		if oom != -997 {
			oom = -997
			adj.SetLinuxOomScoreAdj(&oom)
		}
	}
	p.known[c.Id] = struct{}{}
	return adj, nil, nil
}

// memTotal reads MemTotal from /proc/meminfo in bytes (0 if unreadable).
func memTotal() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kib, _ := strconv.ParseInt(f[1], 10, 64)
			return kib * 1024
		}
	}
	return 0
}

func main() {
	socket := flag.String("socket", "/var/run/nri/nri.sock", "NRI socket to dial")
	flag.Parse()
	p := &plugin{known: map[string]struct{}{}, memTotal: memTotal()}
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
