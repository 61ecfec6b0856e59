//go:build !unix

package valkeystream_test

import (
	"errors"
	"os"
)

// Without SIGSTOP a freeze of the transform crash audit is left out.
func crashStop(*os.Process) error { return errors.ErrUnsupported }
func crashCont(*os.Process) error { return errors.ErrUnsupported }

const crashCanFreeze = false
