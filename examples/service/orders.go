package main

// This file is the order domain: the events and what each handler does. Its
// effects are keys in the server, so that anyone (the end-to-end test, or
// you with redis-cli) can see what happened and how often.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
)

// OrderPlaced is published when a customer places an order. Billing,
// shipping and the reminder scheduler each handle every one, in a consumer
// group of their own.
type OrderPlaced struct {
	OrderID  string `json:"order_id"`
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
}

// PaymentReminderDue is published, delayed, when an order is placed: the
// customer is reminded of the invoice once it falls due.
type PaymentReminderDue struct {
	OrderID string    `json:"order_id"`
	DueAt   time.Time `json:"due_at"`
}

// The keys the handlers write. Each effect is a SET NX, so a repeated
// handling cannot repeat it; it is counted under repeatsKey instead.
const (
	keyPrefix = "shop:"
	// poisonFixedKey, when it exists, means billing's fraud rule has been
	// fixed and accepts the customer "poison".
	poisonFixedKey = keyPrefix + "rules:poison-fixed"
	// earlyRemindersKey counts reminders handled before their due time.
	earlyRemindersKey = keyPrefix + "early-reminders"
)

func chargeKey(order string) string     { return keyPrefix + "charge:" + order }
func shippedKey(order string) string    { return keyPrefix + "shipped:" + order }
func remindedKey(order string) string   { return keyPrefix + "reminded:" + order }
func repeatsKey(handler string) string  { return keyPrefix + "repeats:" + handler }
func chargeValue(deliveries int) string { return fmt.Sprintf("delivery %d", deliveries) }

// Customers the example treats specially.
const (
	// poisonCustomer fails billing's fraud rule (a bug) until poisonFixedKey
	// is set: billing fails on every delivery, and the order is
	// dead-lettered after maxDeliveries.
	poisonCustomer = "poison"
	// busyCustomer's bank asks, on the first delivery, to come back later:
	// billing answers with valkeystream.RetryAfter.
	busyCustomer = "busy"
)

// errBankBusy is what the bank of busyCustomer answers at first.
var errBankBusy = errors.New("bank: busy, try again shortly")

// handlers holds what the handlers need.
type handlers struct {
	client        redis.UniversalClient
	bus           *cqrs.EventBus
	reminderDelay time.Duration
	logger        *log.Logger
}

// eventHandlers returns the service's handlers. Each handler's name is also
// its consumer group (see subscriberFor in main.go).
func (h *handlers) eventHandlers() []cqrs.EventHandler {
	return []cqrs.EventHandler{
		cqrs.NewEventHandler("billing", h.bill),
		cqrs.NewEventHandler("shipping", h.ship),
		cqrs.NewEventHandler("schedule-reminder", h.scheduleReminder),
		cqrs.NewEventHandler("send-reminder", h.sendReminder),
	}
}

// bill charges the order.
func (h *handlers) bill(ctx context.Context, o *OrderPlaced) error {
	msg := cqrs.OriginalMessageFromCtx(ctx)
	if o.Cents <= 0 {
		// Retrying cannot help: dead-letter it at once, with the reason.
		return valkeystream.GiveUp(msg, fmt.Errorf("order %s: invalid amount %d", o.OrderID, o.Cents))
	}
	if o.Customer == poisonCustomer {
		fixed, err := h.client.Exists(ctx, poisonFixedKey).Result()
		if err != nil {
			return err
		}
		if fixed == 0 {
			// A plain error: retried in the process, then redelivered,
			// then dead-lettered on delivery maxDeliveries.
			return fmt.Errorf("order %s: fraud rule rejects customer %q", o.OrderID, o.Customer)
		}
	}
	deliveries := valkeystream.DeliveryCount(msg)
	if o.Customer == busyCustomer && deliveries == 1 {
		// Come back in a moment; the other orders flow on meanwhile.
		return valkeystream.RetryAfter(msg, 200*time.Millisecond, errBankBusy)
	}
	return h.once(ctx, "billing", chargeKey(o.OrderID), chargeValue(deliveries), "charged %s (%d cents, delivery %d)",
		o.OrderID, o.Cents, deliveries)
}

// ship ships the order.
func (h *handlers) ship(ctx context.Context, o *OrderPlaced) error {
	return h.once(ctx, "shipping", shippedKey(o.OrderID), "shipped", "shipped %s", o.OrderID)
}

// scheduleReminder publishes the order's payment reminder, delayed by
// reminderDelay: the Publisher holds it on the server until it is due.
func (h *handlers) scheduleReminder(ctx context.Context, o *OrderPlaced) error {
	due := time.Now().Add(h.reminderDelay)
	return h.bus.Publish(delay.WithContext(ctx, delay.Until(due)), &PaymentReminderDue{OrderID: o.OrderID, DueAt: due})
}

// sendReminder "sends" the reminder, noting whether it came before its due
// time (it never should).
func (h *handlers) sendReminder(ctx context.Context, r *PaymentReminderDue) error {
	now := time.Now()
	if now.Before(r.DueAt) {
		if err := h.client.Incr(ctx, earlyRemindersKey).Err(); err != nil {
			return err
		}
	}
	return h.once(ctx, "send-reminder", remindedKey(r.OrderID), now.Format(time.RFC3339Nano),
		"reminded %s (due %s)", r.OrderID, r.DueAt.Format(time.TimeOnly))
}

// once performs an effect: it sets key to value unless it exists, and
// counts a repeat of handler otherwise (a handling repeated after a crash).
func (h *handlers) once(ctx context.Context, handler, key, value, format string, args ...any) error {
	set, err := h.client.SetNX(ctx, key, value, 0).Result()
	if err != nil {
		return err
	}
	if !set {
		return h.client.Incr(ctx, repeatsKey(handler)).Err()
	}
	h.logger.Printf(format, args...)
	return nil
}
