package fakekernel

import "fmt"

// Commit records generation of sandbox's volume as committed by a writer
// of another kernel (another node sharing this kernel's block store): a
// seal there is a generation here.
func (k *Kernel) Commit(sandbox string, generation uint64, what string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	vol := k.vol(sandbox)
	if _, ok := vol.gens[generation]; ok {
		return fmt.Errorf("commit %s@%d: generation exists", sandbox, generation)
	}
	vol.gens[generation] = what
	return nil
}
