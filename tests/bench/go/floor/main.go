// Command floor is the benchmark's floor: a trivial NRI plugin on NRI's own stub
// (github.com/containerd/nri/pkg/stub) that pins every container to fixed CPUs
// (-cpus) and decides nothing else. Driven by the same peer, in the same run,
// as our plugin, its round trips are what NRI itself costs.
//
// Ours, small. Usage: floor -nri-socket PATH [-cpus 2-5]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type floor struct{ cpus string }

func (f *floor) pin(ctr *api.Container) *api.ContainerUpdate {
	u := &api.ContainerUpdate{ContainerId: ctr.Id}
	u.SetLinuxCPUSetCPUs(f.cpus)
	return u
}

// Synchronize pins every running container.
func (f *floor) Synchronize(_ context.Context, _ []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	updates := make([]*api.ContainerUpdate, 0, len(ctrs))
	for _, c := range ctrs {
		updates = append(updates, f.pin(c))
	}
	return updates, nil
}

// CreateContainer pins the new container.
func (f *floor) CreateContainer(_ context.Context, _ *api.PodSandbox, _ *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adj := &api.ContainerAdjustment{}
	adj.SetLinuxCPUSetCPUs(f.cpus)
	return adj, nil, nil
}

// UpdateContainer keeps the pinning of the updated container.
func (f *floor) UpdateContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container, _ *api.LinuxResources) ([]*api.ContainerUpdate, error) {
	return []*api.ContainerUpdate{f.pin(ctr)}, nil
}

// StopContainer changes nothing.
func (f *floor) StopContainer(context.Context, *api.PodSandbox, *api.Container) ([]*api.ContainerUpdate, error) {
	return nil, nil
}

// RemoveContainer has nothing to forget.
func (f *floor) RemoveContainer(context.Context, *api.PodSandbox, *api.Container) error {
	return nil
}

func main() {
	socket := flag.String("nri-socket", api.DefaultSocketPath, "the runtime's NRI socket")
	cpus := flag.String("cpus", "2-5", "the CPUs every container is pinned to")
	flag.Parse()
	s, err := stub.New(&floor{cpus: *cpus}, stub.WithPluginName("floor"), stub.WithPluginIdx("90"),
		stub.WithSocketPath(*socket), stub.WithOnClose(func() { os.Exit(0) }))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := s.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
