package manager

// Validate checks a spec as a claim would, before anything is recorded
// (the service admits a create against its owner's quota only after).
func (s Spec) Validate() error { return s.claim("op-validate", 1).Validate() }
