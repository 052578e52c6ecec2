package service

// Payment is what both demo services keep of one payment: a merchant's
// amount charged to a customer (paymentsd's payments, fakepsp's charges).
type Payment struct {
	ID          string // <prefix>_<uuid> (NewID)
	Merchant    string
	Amount      int64  // minor units
	Currency    string // ISO 4217 code, upper case
	Customer    string
	Description string // empty when not given
}

// AmountJSON is the part of a payment's JSON that both services show:
// amount, currency, customer and description (null when empty), in that
// order. Embedded in a struct, its members stand where it does.
type AmountJSON struct {
	Amount      int64   `json:"amount"`
	Currency    string  `json:"currency"`
	Customer    string  `json:"customer"`
	Description *string `json:"description"`
}

// PaymentJSON is a payment as paymentsd's API shows it (POST and GET
// /v1/payments): id, amount, currency, customer, description (null when
// empty), status and created_at (RFC 3339, UTC).
type PaymentJSON struct {
	ID string `json:"id"`
	AmountJSON
	Status    string `json:"status"`
	CreatedAt string `json:"created_at"`
}

// AmountJSON returns p's AmountJSON.
func (p Payment) AmountJSON() AmountJSON {
	j := AmountJSON{Amount: p.Amount, Currency: p.Currency, Customer: p.Customer}
	if p.Description != "" {
		j.Description = &p.Description
	}
	return j
}
