package valkeystream

import "github.com/ThreeDotsLabs/watermill/message"

// The Watermill interfaces the exported types implement, checked when the
// package compiles.
var (
	_ message.Subscriber           = (*Subscriber)(nil)
	_ message.SubscribeInitializer = (*Subscriber)(nil)
	_ message.Publisher            = (*Publisher)(nil)
)
