package api

// ValidateProcess checks a process as a claim's is checked (args, env,
// cwd, ids; args may be empty): ctld checks a template image's defaults
// with it before a claim takes them.
func ValidateProcess(p Process) error {
	if err := validateCommand("process", p.Args, p.Env, p.Cwd, false); err != nil {
		return err
	}
	if p.UID == noID || p.GID == noID {
		return invalid("process.uid %d, process.gid %d: %d is not a user or group id", p.UID, p.GID, noID)
	}
	return nil
}
