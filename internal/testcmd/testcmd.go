// Package testcmd holds the go test invocations of the project's test
// command, which internal/cmd/tests runs side by side and
// internal/cmd/flakes runs again and again.
package testcmd

// Step is one go test invocation: its go arguments from "test" to its last
// flag, and its packages. Flags of a caller's go between the two.
type Step struct {
	Args []string
	Pkgs []string
}

// Steps returns the invocations of the test command: this module's tests,
// then the compat and examples modules', each a module of its own that ./...
// does not descend into. In this module the tests that start servers of
// their own run eight at a time (-parallel 8): they mostly wait on timers
// and servers.
func Steps() []Step {
	all := []string{"./..."}
	return []Step{
		{Args: Own(), Pkgs: all},
		{Args: []string{"test", "-C", "compat", "-race", "-count=1"}, Pkgs: all},
		{Args: []string{"test", "-C", "examples", "-race", "-count=1"}, Pkgs: all},
	}
}

// Own returns the go arguments of a go test of this module's packages.
func Own() []string { return []string{"test", "-race", "-count=1", "-parallel", "8"} }

// Command returns s's go arguments with flags between its own and its
// packages.
func (s Step) Command(flags ...string) []string {
	args := append(append([]string(nil), s.Args...), flags...)
	return append(args, s.Pkgs...)
}
