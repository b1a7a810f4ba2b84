// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @title IStakeRegistryTypes
/// @notice The structs and enums of the StakeRegistry ABI (field order is part of the ABI and of
///         the storage layout).
interface IStakeRegistryTypes {
    /// @notice What an address is registered as (one role per address).
    enum Role {
        None,
        Operator,
        Verifier
    }

    /// @notice One staker. `stake` includes `unbonding`; `locked` is the sum of the liabilities of
    ///         live disputes (it may exceed `stake`; a slash takes at most `stake`). Active
    ///         (voting / serving) stake = stake - unbonding. `slot` is the verifier's draw-tree
    ///         slot (0 = none).
    struct Account {
        uint112 stake;
        uint112 unbonding;
        Role role; // same slot as stake: one read answers isActiveOperator
        uint128 locked;
        uint64 unbondReadyAt;
        uint24 slot;
    }
}
