// Command peer is the benchmark's runtime peer: an NRI runtime built on NRI's own
// runtime side (github.com/containerd/nri/pkg/adaptation, as containerd uses it),
// independent of our Python runtime simulator.
//
// For each count N of -running it listens on -socket, launches the plugin
// command given after "--" (the plugin connects as an external plugin), waits
// until the plugin is registered and Synchronize'd with N running burstable
// containers (200m, no balloon annotation: the default balloon), then drives
// -warmup untimed and -cycles timed HP pods (2 CPUs, balloon hp-bln) and as
// many LP pods (4 CPUs, lp-bln) through RunPodSandbox, CreateContainer, StartContainer, UpdateContainer,
// StopContainer, RemoveContainer and the pod's stop and removal. It times every
// request round trip and, at the largest N, -restarts restarts of the plugin
// process (to registered and synchronized again; the median is the figure). It prints one JSON document on stdout:
// per N, p50/p99 (in ms) of every request kind, split by pod class for create.
// "{running}" in the plugin command is replaced by N (a state directory per round).
//
// Before timing, it waits until a create reaches the plugin (onPath), and it
// counts the timed creates whose reply set no CPUs (unadjusted_creates).
//
// Ours, small; it asserts nothing. Usage:
//
//	peer -socket /tmp/x/nri.sock -running 0,100,500,1000 -cycles 100 -- plugin args...
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/log"
)

const balloonKey = "balloon.balloons.resource-policy.nri.io"

// Stats is the summary of one request kind's round trips.
type Stats struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	// Slowest are the three largest samples, largest first: whether a p99 of
	// a hundred samples is one outlier or a tail.
	Slowest []float64 `json:"slowest_ms"`
	// Samples are all of them in the order they were taken (-samples only).
	Samples []float64 `json:"samples_ms,omitempty"`
}

// Round is what one count of running containers measured.
type Round struct {
	Running     int              `json:"running"`
	Registered  float64          `json:"registered_ms"`
	Synchronize float64          `json:"synchronize_ms"`
	Requests    map[string]Stats `json:"requests"`
	Restart     *float64         `json:"restart_ms,omitempty"`
	RestartSync *float64         `json:"restart_synchronize_ms,omitempty"`
	Restarts    []float64        `json:"restarts_ms,omitempty"`
	PluginRSS   float64          `json:"plugin_rss_mb"`
	// Unadjusted counts the timed creates whose reply carried no CPU set: the
	// adaptation answered them without the plugin (it closed the plugin on a
	// fatal error, logged on stderr, or had not added it yet).
	Unadjusted int `json:"unadjusted_creates"`
}

// Result is the document printed on stdout.
type Result struct {
	Peer   string  `json:"peer"`
	Cycles int     `json:"cycles"`
	Rounds []Round `json:"rounds"`
}

// runtime is the peer's container state and its NRI adaptation.
type runtime struct {
	mu       sync.Mutex
	pods     []*nri.PodSandbox
	ctrs     []*nri.Container
	byID     map[string]*nri.Container // ctrs by id (apply)
	nri      *nri.Adaptation
	synced   chan float64 // the Synchronize round trip of each (re)registration
	syncErrs chan error
	// creates answered without a CPU set since the last reset
	unadjusted int
}

// pinned: the create's reply sets the container's CPUs, as every plugin the
// peer drives does (balloons, and the floor's fixed CPUs).
func pinned(rsp *nri.CreateContainerResponse) bool {
	adj := rsp.GetAdjust()
	return adj.GetLinux().GetResources().GetCpu().GetCpus() != ""
}

func cpuResources(shares uint64, quota int64) *nri.LinuxResources {
	cpu := &nri.LinuxCPU{Shares: api.UInt64(shares)}
	if quota > 0 {
		cpu.Quota = api.Int64(quota)
		cpu.Period = api.UInt64(uint64(100000))
	}
	return &nri.LinuxResources{Cpu: cpu, Memory: &nri.LinuxMemory{}}
}

func newPod(id string, qos string, annotations map[string]string) *nri.PodSandbox {
	return &nri.PodSandbox{
		Id: id, Name: id, Uid: "u" + id, Namespace: "bench", Annotations: annotations,
		Linux: &nri.LinuxPodSandbox{CgroupParent: "/kubepods/" + qos + "pod" + id},
	}
}

func newContainer(pod *nri.PodSandbox, res *nri.LinuxResources) *nri.Container {
	return &nri.Container{
		Id: "c" + pod.Id, PodSandboxId: pod.Id, Name: "bench",
		State: nri.ContainerState_CONTAINER_CREATED,
		Linux: &nri.LinuxContainer{
			Resources:   res,
			CgroupsPath: pod.Linux.CgroupParent + "/c" + pod.Id,
		},
	}
}

// syncFn hands the plugin every running pod and container and times the round trip.
func (r *runtime) syncFn(ctx context.Context, cb nri.SyncCB) error {
	r.mu.Lock()
	pods, ctrs := r.pods, r.ctrs
	r.mu.Unlock()
	t0 := time.Now()
	updates, err := cb(ctx, pods, ctrs)
	if err != nil {
		r.syncErrs <- err
		return err
	}
	ms := msSince(t0)
	r.apply(updates)
	r.synced <- ms
	return nil
}

// updateFn accepts every unsolicited update (the peer keeps no cgroups).
func (r *runtime) updateFn(_ context.Context, updates []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) {
	r.apply(updates)
	return nil, nil
}

// apply keeps the cpuset of each update on the running container it names,
// as a runtime keeps the resources it applied: a restarted plugin's
// Synchronize sees the containers where the plugin put them.
func (r *runtime) apply(updates []*nri.ContainerUpdate) {
	if len(updates) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byID == nil {
		r.byID = map[string]*nri.Container{}
		for _, c := range r.ctrs {
			r.byID[c.Id] = c
		}
	}
	for _, u := range updates {
		c := r.byID[u.GetContainerId()]
		cpu := u.GetLinux().GetResources().GetCpu()
		if c == nil || cpu == nil {
			continue
		}
		have := c.Linux.Resources.Cpu
		if cpu.Cpus != "" {
			have.Cpus = cpu.Cpus
		}
		if cpu.Mems != "" {
			have.Mems = cpu.Mems
		}
	}
}

func msSince(t0 time.Time) float64 { return float64(time.Since(t0).Nanoseconds()) / 1e6 }

func quantile(samples []float64, q float64) float64 {
	if len(samples) == 0 {
		return 0
	}
	s := append([]float64(nil), samples...)
	sort.Float64s(s)
	i := int(q * float64(len(s)))
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}

// slowest is the n largest of samples, largest first.
func slowest(samples []float64, n int) []float64 {
	s := append([]float64(nil), samples...)
	sort.Sort(sort.Reverse(sort.Float64Slice(s)))
	if len(s) > n {
		s = s[:n]
	}
	return s
}

// plugin is the launched plugin process.
type plugin struct {
	cmd  *exec.Cmd
	done chan error
}

func launch(args []string, running int, logFile *os.File) (*plugin, error) {
	expanded := make([]string, len(args))
	for i, arg := range args {
		expanded[i] = strings.ReplaceAll(arg, "{running}", strconv.Itoa(running))
	}
	cmd := exec.Command(expanded[0], expanded[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &plugin{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

func (p *plugin) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *plugin) rssMB() float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// waitSynced waits for the launched plugin's registration and Synchronize.
func (r *runtime) waitSynced(p *plugin, timeout time.Duration) (float64, error) {
	select {
	case ms := <-r.synced:
		return ms, nil
	case err := <-r.syncErrs:
		return 0, fmt.Errorf("synchronize failed: %w", err)
	case err := <-p.done:
		p.done <- err
		return 0, fmt.Errorf("the plugin exited before it registered: %v", err)
	case <-time.After(timeout):
		return 0, errors.New("the plugin did not register and synchronize in time")
	}
}

// cycle drives one pod through its life; returns its request round trips by kind.
func (r *runtime) cycle(ctx context.Context, pod *nri.PodSandbox, res *nri.LinuxResources, times map[string][]float64, class string) error {
	ctr := newContainer(pod, res)
	timed := func(kind string, call func() error) error {
		t0 := time.Now()
		err := call()
		times[kind] = append(times[kind], msSince(t0))
		if err != nil {
			return fmt.Errorf("%s of %s: %w", kind, ctr.Id, err)
		}
		return nil
	}
	event := func(call func(context.Context, *nri.StateChangeEvent) error) error {
		return call(ctx, &nri.StateChangeEvent{Pod: pod, Container: ctr})
	}
	if err := r.nri.RunPodSandbox(ctx, &nri.StateChangeEvent{Pod: pod}); err != nil {
		return err
	}
	var created *nri.CreateContainerResponse
	err := timed("create_"+class, func() error {
		var err error
		created, err = r.nri.CreateContainer(ctx, &nri.CreateContainerRequest{Pod: pod, Container: ctr})
		return err
	})
	if err != nil {
		return err
	}
	if !pinned(created) {
		r.unadjusted++
	}
	r.apply(created.GetUpdate())
	if err := event(r.nri.PostCreateContainer); err != nil {
		return err
	}
	ctr.State = nri.ContainerState_CONTAINER_RUNNING
	// timed: with an SST helper the plugin answers it once the create's commit ended
	if err := timed("start_"+class, func() error { return event(r.nri.StartContainer) }); err != nil {
		return err
	}
	if err := event(r.nri.PostStartContainer); err != nil {
		return err
	}
	err = timed("update", func() error {
		updated, err := r.nri.UpdateContainer(ctx, &nri.UpdateContainerRequest{
			Pod: pod, Container: ctr, LinuxResources: res,
		})
		r.apply(updated.GetUpdate())
		return err
	})
	if err != nil {
		return err
	}
	if err := event(r.nri.PostUpdateContainer); err != nil {
		return err
	}
	err = timed("stop", func() error {
		stopped, err := r.nri.StopContainer(ctx, &nri.StopContainerRequest{Pod: pod, Container: ctr})
		r.apply(stopped.GetUpdate())
		return err
	})
	if err != nil {
		return err
	}
	ctr.State = nri.ContainerState_CONTAINER_STOPPED
	if err := timed("remove", func() error { return event(r.nri.RemoveContainer) }); err != nil {
		return err
	}
	if err := r.nri.StopPodSandbox(ctx, &nri.StateChangeEvent{Pod: pod}); err != nil {
		return err
	}
	return r.nri.RemovePodSandbox(ctx, &nri.StateChangeEvent{Pod: pod})
}

// onPath drives untimed probe pods until a create comes back pinned. NRI's
// adaptation adds a plugin to the ones it asks only after the Synchronize
// callback has returned, and waitSynced wakes first: without this wait a whole
// round could run before the plugin is added (seen: every create of a round at
// 1000 running answered by the runtime alone in ~1 us).
func (r *runtime) onPath(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for i := 0; ; i++ {
		before := r.unadjusted
		pod := newPod(fmt.Sprintf("p%d", i), "burstable/", nil)
		if err := r.cycle(ctx, pod, cpuResources(204, 0), map[string][]float64{}, "probe"); err != nil {
			return err
		}
		if r.unadjusted == before {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the plugin got no request after its Synchronize")
		}
		time.Sleep(time.Millisecond)
	}
}

// keepSamples: the -samples flag.
var keepSamples bool

// round measures one count of running containers; restart: also that many
// plugin restarts (their median is the figure: one start is one sample of a
// process's scheduling on a shared machine).
func round(socket string, running, cycles, warmup, restart int, args []string, logFile *os.File, timeout time.Duration) (*Round, error) {
	r := &runtime{synced: make(chan float64, 4), syncErrs: make(chan error, 4)}
	for i := 0; i < running; i++ {
		p := newPod(fmt.Sprintf("b%d", i), "burstable/", nil)
		c := newContainer(p, cpuResources(204, 0))
		c.State = nri.ContainerState_CONTAINER_RUNNING
		r.pods, r.ctrs = append(r.pods, p), append(r.ctrs, c)
	}
	a, err := nri.New("nri-bench-peer", "0.1", r.syncFn, r.updateFn,
		nri.WithSocketPath(socket), nri.WithPluginPath(os.DevNull+".none"),
		nri.WithPluginConfigPath(os.DevNull+".none"))
	if err != nil {
		return nil, err
	}
	r.nri = a
	if err := a.Start(); err != nil {
		return nil, err
	}
	defer a.Stop()
	t0 := time.Now()
	p, err := launch(args, running, logFile)
	if err != nil {
		return nil, err
	}
	defer func() { p.stop() }()
	out := &Round{Running: running, Requests: map[string]Stats{}}
	if out.Synchronize, err = r.waitSynced(p, timeout); err != nil {
		return nil, err
	}
	out.Registered = msSince(t0)
	ctx := context.Background()
	if err := r.onPath(ctx, timeout); err != nil {
		return nil, err
	}
	times := map[string][]float64{}
	hp := map[string]string{balloonKey: "hp-bln"}
	lp := map[string]string{balloonKey: "lp-bln"}
	for i := -warmup; i < cycles; i++ {
		if i == 0 {
			times = map[string][]float64{} // the warm-up cycles are not counted
			r.unadjusted = 0
		}
		if err := r.cycle(ctx, newPod(fmt.Sprintf("h%d", i), "", hp), cpuResources(2048, 200000), times, "hp"); err != nil {
			return nil, err
		}
		if err := r.cycle(ctx, newPod(fmt.Sprintf("l%d", i), "", lp), cpuResources(4096, 400000), times, "lp"); err != nil {
			return nil, err
		}
	}
	times["create"] = append(append([]float64(nil), times["create_hp"]...), times["create_lp"]...)
	for kind, samples := range times {
		st := Stats{Count: len(samples), P50: quantile(samples, 0.5), P99: quantile(samples, 0.99),
			Slowest: slowest(samples, 3)}
		if keepSamples {
			st.Samples = samples
		}
		out.Requests[kind] = st
	}
	out.PluginRSS = p.rssMB()
	out.Unadjusted = r.unadjusted
	var restarts, syncs []float64
	for i := 0; i < restart; i++ {
		p.stop()
		t1 := time.Now()
		if p, err = launch(args, running, logFile); err != nil {
			return nil, err
		}
		sync, err := r.waitSynced(p, timeout)
		if err != nil {
			return nil, fmt.Errorf("restart: %w", err)
		}
		restarts, syncs = append(restarts, msSince(t1)), append(syncs, sync)
	}
	if len(restarts) > 0 {
		ms, sync := quantile(restarts, 0.5), quantile(syncs, 0.5)
		out.Restart, out.RestartSync, out.Restarts = &ms, &sync, restarts
	}
	return out, nil
}

func main() {
	socket := flag.String("socket", "", "the NRI socket to listen on")
	counts := flag.String("running", "0,100,500,1000", "counts of running containers, one round each")
	cycles := flag.Int("cycles", 100, "HP and LP pods created and removed per round (each)")
	warmup := flag.Int("warmup", 5, "cycles before the timed ones in each round (not counted)")
	restarts := flag.Int("restarts", 5, "at the largest count, also time this many plugin restarts (their median)")
	logPath := flag.String("plugin-log", os.DevNull, "where the plugin's output goes")
	timeout := flag.Duration("timeout", 60*time.Second, "registration and request timeout")
	flag.BoolVar(&keepSamples, "samples", false, "also print every sample of each request kind")
	flag.Parse()
	args := flag.Args()
	if *socket == "" || len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: peer -socket PATH [flags] -- plugin command...")
		os.Exit(2)
	}
	log.Set(quiet{})
	nri.SetPluginRegistrationTimeout(*timeout)
	nri.SetPluginRequestTimeout(*timeout)
	logFile, err := os.OpenFile(*logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var ns []int
	for _, s := range strings.Split(*counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			fmt.Fprintf(os.Stderr, "bad -running %q\n", *counts)
			os.Exit(2)
		}
		ns = append(ns, n)
	}
	largest := 0
	for _, n := range ns {
		if n > largest {
			largest = n
		}
	}
	res := Result{Peer: "containerd/nri adaptation", Cycles: *cycles}
	for _, n := range ns {
		restart := 0
		if n == largest {
			restart = *restarts
		}
		rd, err := round(*socket, n, *cycles, *warmup, restart, args, logFile, *timeout)
		if err != nil {
			fmt.Fprintf(os.Stderr, "peer: %d running containers: %v\n", n, err)
			os.Exit(1)
		}
		res.Rounds = append(res.Rounds, *rd)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", " ")
	if err := enc.Encode(res); err != nil {
		os.Exit(1)
	}
}

// quiet drops NRI's info logs (they would time the logger) and keeps warnings.
type quiet struct{}

func (quiet) Debugf(context.Context, string, ...interface{}) {}
func (quiet) Infof(context.Context, string, ...interface{})  {}
func (quiet) Warnf(_ context.Context, f string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "nri: "+f+"\n", a...)
}
func (quiet) Errorf(_ context.Context, f string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "nri: "+f+"\n", a...)
}
