package partition

import "errors"

// ErrFenced is wrapped by the error of a call that must be made by the
// partition's owner (a read, an Ack, a hand-over, a renewal, ...) when the
// caller's ownership has ended: its record lapsed, and another member may
// have acquired the partition. The call changed nothing. The caller must stop
// handling the partition at once (what it holds is the new owner's now) and
// may acquire it again when the assignment gives it back.
var ErrFenced = errors.New("partition: the ownership of the partition is not the caller's any more")

// ErrHeld is wrapped by the error of an Acquire of a partition that another
// member holds (or the caller, under another epoch): wait until its owner
// releases it or its record lapses, and try again.
var ErrHeld = errors.New("partition: the partition is held by another owner")
